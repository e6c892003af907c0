#!/usr/bin/env bash
# Exports the two third-party NSA implementations that benchmarks/bench_nsa_others.py times
# into the git-ignored third_party/ (their code is never committed here), and the einops
# wheel into the git-ignored .whl/ (the GPU image already has einops; the wheel is a fallback).
#
#   benchmarks/others_setup.sh [FLA_GIT_DIR] [XUNHAO_GIT_DIR]
#
# Each argument is a git directory (bare or not) of the repository, e.g. the mirror that the
# search tool's `fetch` returns; defaults: the mirror paths below, or $FLA_GIT / $XUNHAO_GIT.
# Without a mirror: `git clone https://github.com/fla-org/flash-linear-attention` (and
# XunhaoLai/native-sparse-attention-triton) and pass their .git folders. Set REV (e.g.
# REV=bc3b101) to export another commit than HEAD. Only the python package folders the
# benchmark imports are exported (about 1 MiB), so `carry: ["third_party", ".whl"]` stays small.
set -euo pipefail

cd "$(dirname "$0")/.."
fla_git="${1:-${FLA_GIT:-/work/.mirror/fla-org+flash-linear-attention/repo}}"
xun_git="${2:-${XUNHAO_GIT:-/work/.mirror/XunhaoLai+native-sparse-attention-triton/repo}}"
rev="${REV:-HEAD}"

export_tree() {  # git dir, destination, paths inside the repository
    local gitdir=$1 dest=$2
    shift 2
    rm -rf "$dest"
    mkdir -p "$dest"
    git --git-dir="$gitdir" archive "$rev" -- "$@" | tar -x -C "$dest"
    # the benchmark prints this commit beside its own; written here because the export has no .git
    git --git-dir="$gitdir" rev-parse "$rev^{commit}" >"$dest/COMMIT"
    echo "$dest: $(cut -c1-12 "$dest/COMMIT") ($(du -sh "$dest" | cut -f1))"
}

# fla: only what fla.ops.nsa.parallel imports (its package __init__ files pull in layers and
# models that need transformers; the benchmark bypasses them, see _bare_package there)
export_tree "$fla_git" third_party/fla LICENSE \
    fla/__init__.py fla/utils fla/ops/backends fla/ops/utils fla/ops/attn fla/ops/nsa
# XunhaoLai: the ops package (Triton kernels and their torch references)
export_tree "$xun_git" third_party/nsa_xunhao LICENSE \
    native_sparse_attention/__init__.py native_sparse_attention/ops

if ! grep -qx '/third_party/' .gitignore; then
    echo "note: /third_party/ is not in .gitignore; add it before any commit" >&2
fi

# einops (imported by fla.ops.attn.parallel and Xunhao's weighted_pool): on the GPU image
# already; the wheel lets a machine without it install it offline
# (python3 -m pip install --no-index --find-links .whl einops)
pip_cmd=(python3 -m pip)
[ -x .venv/bin/pip ] && pip_cmd=(.venv/bin/pip)
if ls .whl/einops-*.whl >/dev/null 2>&1; then
    echo ".whl: $(ls .whl/einops-*.whl)"
else
    "${pip_cmd[@]}" download --no-deps --only-binary=:all: -d .whl einops >/dev/null &&
        echo ".whl: $(ls .whl/einops-*.whl)" ||
        echo "warning: could not download the einops wheel (fine if the GPU image has einops)" >&2
fi
