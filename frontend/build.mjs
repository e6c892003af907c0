// Builds kgrade's browser assets from frontend/node_modules (installed by `npm ci` from
// frontend/package-lock.json) into service/static/vendor/:
//
//   editor.js                    CodeMirror 6 editor (src/editor.js), one minified IIFE
//   katex/katex.min.js, katex/katex.min.css, katex/fonts/*, katex/contrib/auto-render.min.js
//   chart.umd.min.js             Chart.js v4 UMD build (window.Chart)
//   licenses/<name>.txt          licence text of every shipped package ("/" in names -> "__")
//   manifest.json                [{name, version, license, license_file, files}] per package
//
// Run: node frontend/build.mjs (from any directory; `make assets` runs it). The output depends
// only on the lock file and src/: the same lock gives byte-identical files. Anything missing
// (a package, a file, a licence) stops the build with a non-zero exit and vendor/ unchanged.

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const FRONTEND = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.dirname(FRONTEND);
const NODE_MODULES = path.join(FRONTEND, "node_modules");
const STATIC = path.join(ROOT, "service", "static");
const VENDOR = path.join(STATIC, "vendor");

// Packages whose code another shipped file embeds (checked against the file's text below).
const EMBEDDED = {
  "chart.umd.min.js": [{ name: "@kurkle/color", marker: "@kurkle/color v" }],
};

function fail(message) {
  console.error(`frontend/build.mjs: error: ${message}`);
  process.exit(1);
}

function mustExist(file, what) {
  if (!fs.existsSync(file)) fail(`${what} not found: ${path.relative(ROOT, file)}`);
  return file;
}

function readJson(file) {
  return JSON.parse(fs.readFileSync(mustExist(file, "file"), "utf8"));
}

const lock = readJson(path.join(FRONTEND, "package-lock.json"));
mustExist(NODE_MODULES, "frontend/node_modules (run `make assets`, which runs npm ci)");

// Directory (relative to frontend/) of an installed package, as the lock file names it.
function packageDir(name) {
  return path.posix.join("node_modules", name);
}

// name, version and licence of the package installed in relDir (relative to frontend/),
// checked against the lock so that a stale node_modules cannot leak into the output.
function packageInfo(relDir) {
  const pkg = readJson(path.join(FRONTEND, relDir, "package.json"));
  const locked = lock.packages?.[relDir];
  if (!locked) fail(`${relDir} is not in frontend/package-lock.json`);
  if (locked.version !== pkg.version) {
    fail(
      `${pkg.name} is ${pkg.version} in node_modules but ${locked.version} in the lock ` +
        "(run `make assets` to reinstall with npm ci)",
    );
  }
  let license = pkg.license ?? pkg.licenses;
  if (Array.isArray(license)) license = license.map((l) => l.type ?? l).join(" OR ");
  else if (license && typeof license === "object") license = license.type;
  if (!license) fail(`${pkg.name} declares no licence in its package.json`);
  return { name: pkg.name, version: pkg.version, license, dir: relDir };
}

function licenseText(info) {
  const dir = path.join(FRONTEND, info.dir);
  const candidates = fs
    .readdirSync(dir)
    .filter((f) => /^(licen[cs]e|copying)([.-][^/]*)?$/i.test(f))
    .filter((f) => !/3rd|third/i.test(f))
    .sort();
  if (candidates.length === 0) fail(`no LICENSE file in ${info.dir}`);
  const text = candidates
    .map((f) => fs.readFileSync(path.join(dir, f), "utf8").replace(/\r\n/g, "\n").trim())
    .join("\n\n");
  if (!text) fail(`empty licence file in ${info.dir}`);
  return `${info.name} ${info.version} (${info.license})\n\n${text}\n`;
}

function copy(from, to) {
  mustExist(from, "file");
  fs.mkdirSync(path.dirname(to), { recursive: true });
  fs.copyFileSync(from, to);
}

// Build into a fresh folder (inside the ignored node_modules, so that an interrupted build
// leaves nothing in service/) and swap it in at the end: a failed build leaves the previous
// vendor/ intact and a running server never sees a half-written one.
fs.mkdirSync(STATIC, { recursive: true });
const OUT = fs.mkdtempSync(path.join(NODE_MODULES, ".kgrade-vendor-"));
fs.chmodSync(OUT, 0o755); // mkdtemp makes it 0700
process.on("exit", (code) => {
  if (code !== 0) fs.rmSync(OUT, { recursive: true, force: true });
});

const shipped = new Map(); // name -> {name, version, license, dir, files:Set}

function ship(info, file) {
  const known = shipped.get(info.name);
  if (known && known.dir !== info.dir) {
    fail(
      `${info.name} would ship twice (${known.dir} ${known.version} and ${info.dir} ` +
        `${info.version}); dedupe it in frontend/package.json`,
    );
  }
  const entry = known ?? { ...info, files: new Set() };
  entry.files.add(file);
  shipped.set(info.name, entry);
}

// 1. The editor bundle. esbuild is imported only here: a missing node_modules fails above with
//    a clearer message than a module-resolution error.
mustExist(path.join(NODE_MODULES, "esbuild"), "esbuild");
const { build } = await import("esbuild");
const result = await build({
  absWorkingDir: FRONTEND,
  entryPoints: ["src/editor.js"],
  outfile: path.join(OUT, "editor.js"),
  bundle: true,
  minify: true,
  format: "iife",
  platform: "browser",
  target: "es2019",
  charset: "utf8",
  legalComments: "none",
  sourcemap: false,
  metafile: true,
  logLevel: "warning",
  banner: { js: "/*! kgrade editor (CodeMirror 6); licences: licenses/, manifest.json */" },
}).catch(() => fail("esbuild failed (see above)"));

const outputs = Object.values(result.metafile.outputs);
if (outputs.length !== 1) fail(`esbuild wrote ${outputs.length} files, expected 1`);
const bundledDirs = new Set();
for (const [input, { bytesInOutput }] of Object.entries(outputs[0].inputs)) {
  if (bytesInOutput === 0) continue; // imported but entirely tree-shaken away
  const at = input.lastIndexOf("node_modules/");
  if (at < 0) {
    if (!input.startsWith("src/")) fail(`unexpected bundle input ${input}`);
    continue;
  }
  const parts = input.slice(at + "node_modules/".length).split("/");
  const name = parts[0].startsWith("@") ? `${parts[0]}/${parts[1]}` : parts[0];
  bundledDirs.add(input.slice(0, at) + packageDir(name));
}
if (bundledDirs.size === 0) fail("the editor bundle contains no packages");
for (const dir of [...bundledDirs].sort()) ship(packageInfo(dir), "editor.js");

// 2. KaTeX: the script, the stylesheet, the fonts it references and auto-render.
const katex = packageInfo(packageDir("katex"));
const katexDist = path.join(FRONTEND, katex.dir, "dist");
const fontsDir = mustExist(path.join(katexDist, "fonts"), "KaTeX fonts folder");
const fonts = fs.readdirSync(fontsDir).sort();
if (fonts.length === 0) fail(`${path.relative(ROOT, fontsDir)} is empty`);
for (const file of [
  "katex.min.js",
  "katex.min.css",
  "contrib/auto-render.min.js",
  ...fonts.map((f) => `fonts/${f}`),
]) {
  copy(path.join(katexDist, file), path.join(OUT, "katex", file));
  ship(katex, `katex/${file}`);
}

// 3. Chart.js UMD build (window.Chart), minified if the package has a minified one.
const chart = packageInfo(packageDir("chart.js"));
if (!chart.version.startsWith("4.")) fail(`chart.js ${chart.version} is not v4`);
const chartDist = path.join(FRONTEND, chart.dir, "dist");
const chartSource = ["chart.umd.min.js", "chart.umd.js"]
  .map((f) => path.join(chartDist, f))
  .find((f) => fs.existsSync(f));
if (!chartSource) fail(`no UMD build (chart.umd.min.js or chart.umd.js) in ${chart.dir}/dist`);
copy(chartSource, path.join(OUT, "chart.umd.min.js"));
ship(chart, "chart.umd.min.js");

// 4. Packages that a copied file embeds.
for (const [file, embedded] of Object.entries(EMBEDDED)) {
  const text = fs.readFileSync(path.join(OUT, file), "utf8");
  for (const { name, marker } of embedded) {
    const dir = packageDir(name);
    if (!text.includes(marker)) fail(`${file} no longer embeds ${name}: update EMBEDDED`);
    ship(packageInfo(dir), file);
  }
}

// 5. Licences and the manifest, in name order.
const manifest = [];
fs.mkdirSync(path.join(OUT, "licenses"));
for (const name of [...shipped.keys()].sort()) {
  const entry = shipped.get(name);
  const licenseFile = `licenses/${name.replaceAll("/", "__")}.txt`;
  fs.writeFileSync(path.join(OUT, licenseFile), licenseText(entry));
  manifest.push({
    name,
    version: entry.version,
    license: entry.license,
    license_file: licenseFile,
    files: [...entry.files].sort(),
  });
}
for (const entry of manifest) {
  for (const file of [...entry.files, entry.license_file]) {
    const full = path.join(OUT, file);
    if (!fs.existsSync(full) || fs.statSync(full).size === 0) fail(`${file} missing or empty`);
  }
}
fs.writeFileSync(path.join(OUT, "manifest.json"), `${JSON.stringify(manifest, null, 2)}\n`);

// 6. Swap the new folder in.
const old = `${OUT}-old`;
if (fs.existsSync(VENDOR)) fs.renameSync(VENDOR, old);
try {
  fs.renameSync(OUT, VENDOR);
} catch (err) {
  if (err.code !== "EXDEV") throw err; // node_modules on another file system: copy instead
  fs.cpSync(OUT, VENDOR, { recursive: true });
  fs.rmSync(OUT, { recursive: true, force: true });
}
fs.rmSync(old, { recursive: true, force: true });

const size = (dir) =>
  fs.readdirSync(dir, { withFileTypes: true }).reduce((n, e) => {
    const full = path.join(dir, e.name);
    return n + (e.isDirectory() ? size(full) : fs.statSync(full).size);
  }, 0);
console.log(
  `frontend/build.mjs: ${manifest.length} packages, ${(size(VENDOR) / 1024).toFixed(0)} KiB ` +
    `in ${path.relative(ROOT, VENDOR)}/`,
);
