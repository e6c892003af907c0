"""Each grading verdict in plain language: what it means, and what to try next."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Explanation:
    title: str
    meaning: str
    next_step: str
    good: bool = False


EXPLANATIONS: dict[str, Explanation] = {
    "PASS": Explanation(
        "Passed",
        "Every test passed: your kernel computes the right values on the public and the hidden "
        "inputs. On a GPU its speed was measured against the course's reference kernel.",
        "To climb the leaderboard, make it faster: fuse work into fewer kernel launches, keep "
        "data in fast memory, and avoid copies. Each new submission is graded afresh.",
        good=True,
    ),
    "WRONG_ANSWER": Explanation(
        "Wrong answer",
        "Your function returned values that differ from the reference by more than the "
        "tolerance on at least one input.",
        "Compare with the statement's formula on a small input. Check the edge cases it names "
        "(empty rows, large values, causal masking) and do the arithmetic in fp32 before "
        "casting the result once.",
    ),
    "TYPE_VIOLATION": Explanation(
        "Wrong type or shape",
        "An output had the wrong type, shape, dtype or device, or was not a plain contiguous "
        "torch.Tensor.",
        "Check the return statement against the signature in the statement: shapes, dtypes "
        "(for instance fp32 log-sum-exp) and that you return new tensors.",
    ),
    "INPUT_MUTATED": Explanation(
        "Inputs changed",
        "Your function modified one of its input tensors in place.",
        "Work on copies, or on new tensors: avoid in-place operations (add_, copy_, x[...] = "
        "...) on the arguments.",
    ),
    "POLICY_VIOLATION": Explanation(
        "Not allowed",
        "The submission imports or calls something the exercise forbids (the course's reference "
        "kernels, the grader, or a ready-made attention library).",
        "Write the kernel yourself with torch (and Triton where allowed); remove the forbidden "
        "import named in the output.",
    ),
    "INTEGRITY_VIOLATION": Explanation(
        "Measurement tampered with",
        "The grader found the submission interfering with how it is checked or timed (for "
        "instance work left running after a call returned, a helper process, or changed "
        "timing functions).",
        "Do all the work inside the call and return finished results; do not start threads or "
        "processes or touch the harness.",
    ),
    "TIMEOUT": Explanation(
        "Too slow",
        "A phase ran past its time limit, so grading stopped.",
        "Look for accidental quadratic loops in Python, per-element work on the host, or a "
        "loop that never ends; try the starter's shapes on your machine first.",
    ),
    "RESOURCE_LIMIT": Explanation(
        "Out of memory or resources",
        "The submission ran out of memory or another limit (processes, file size).",
        "Avoid materialising full T x T score matrices for long sequences: work in blocks.",
    ),
    "RUNTIME_ERROR": Explanation(
        "Crashed",
        "Your code raised an exception or the process died while running.",
        "Read the error in the output below; run the starter's example locally to reproduce it.",
    ),
    "INFRA_ERROR": Explanation(
        "Grader problem (not your fault)",
        "The grading machine failed; this was not charged and gives no grade.",
        "Submit again in a few minutes. If it happens again, tell your instructor.",
    ),
}


def explain(verdict: str | None) -> Explanation | None:
    return EXPLANATIONS.get(verdict or "")
