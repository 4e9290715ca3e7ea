// Builds the page into dist/ (docs/WEB.md, "Building the page"):
//
//   node build.mjs            write dist/
//   node build.mjs --check    build into a temporary dir and fail if it differs from dist/
//
// dist/ is committed and embedded in the `tether` binary by build.rs, so
// `cargo build` needs no Node.js. Everything here is deterministic (esbuild
// output, content hashes, the PNG icons), which is what lets scripts/test
// check that the committed dist/ is the build of the committed sources.
//
// Layout: index.html and manifest.webmanifest at the top, icons/ under
// fixed names, assets/ under content-hashed names (served as immutable).

import { build } from "esbuild";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { iconPng } from "./tools/icons.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const src = join(here, "src");

async function buildInto(out) {
  rmSync(out, { recursive: true, force: true });
  mkdirSync(join(out, "assets"), { recursive: true });
  mkdirSync(join(out, "icons"), { recursive: true });
  const result = await build({
    // Module paths inside the bundle are relative to this dir, so the
    // output is the same from whatever dir the build is started.
    absWorkingDir: here,
    entryPoints: [join(src, "main.js")],
    bundle: true,
    minify: true,
    format: "esm",
    target: ["chrome100", "firefox100", "safari15"],
    entryNames: "[name]-[hash]",
    assetNames: "[name]-[hash]",
    outdir: join(out, "assets"),
    metafile: true,
    legalComments: "eof",
    charset: "utf8",
    logLevel: "warning",
  });
  const names = {};
  for (const file of Object.keys(result.metafile.outputs)) {
    const name = file.split("/").pop();
    const key = name.replace(/-[A-Z0-9]{8}\./, ".");
    names[key] = name;
  }
  if (!names["main.js"] || !names["main.css"]) throw new Error(`esbuild gave ${JSON.stringify(names)}`);
  const html = readFileSync(join(src, "index.html"), "utf8").replace(/\{\{([a-z.]+)\}\}/g, (_, key) => {
    if (!names[key]) throw new Error(`index.html names ${key}, which the build did not produce`);
    return names[key];
  });
  writeFileSync(join(out, "index.html"), html);
  writeFileSync(join(out, "manifest.webmanifest"), readFileSync(join(src, "manifest.webmanifest")));
  writeFileSync(join(out, "icons", "icon.svg"), readFileSync(join(src, "icon.svg")));
  writeFileSync(join(out, "icons", "icon-192.png"), iconPng(192));
  writeFileSync(join(out, "icons", "icon-512.png"), iconPng(512));
  writeFileSync(join(out, "icons", "icon-maskable-512.png"), iconPng(512, { maskable: true }));
}

function digests(dir) {
  const out = new Map();
  const walk = (d) => {
    for (const entry of readdirSync(d).sort()) {
      const path = join(d, entry);
      if (statSync(path).isDirectory()) walk(path);
      else out.set(relative(dir, path), createHash("sha256").update(readFileSync(path)).digest("hex"));
    }
  };
  walk(dir);
  return out;
}

const dist = join(here, "dist");
if (process.argv.includes("--check")) {
  const scratch = mkdtempSync(join(tmpdir(), "tether-web-"));
  try {
    await buildInto(scratch);
    const want = digests(scratch);
    let have;
    try {
      have = digests(dist);
    } catch {
      have = new Map();
    }
    const differ = [...new Set([...want.keys(), ...have.keys()])].filter((f) => want.get(f) !== have.get(f)).sort();
    if (differ.length) {
      console.error(`web/dist is not the build of web/src; differs: ${differ.join(", ")}`);
      console.error("run `npm run build` in web/ and commit web/dist");
      process.exit(1);
    }
    console.error(`web/dist matches the sources (${want.size} files)`);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
} else {
  await buildInto(dist);
  console.error(`built ${[...digests(dist).keys()].join(", ")}`);
}
