// `node tests/run.mjs CASE`: runs one case of cases.mjs in a fresh
// Chromium and exits 0 if it passed. tests/web_browser.rs calls it.

import * as cases from "./cases.mjs";
import { launch } from "./lib.mjs";

const name = process.argv[2];
const run = cases[name];
if (!run) {
  console.error(`no case ${name}; cases: ${Object.keys(cases).join(", ")}`);
  process.exit(2);
}
const browser = await launch();
let failed = false;
try {
  await run(browser);
  console.log(`ok ${name}`);
} catch (e) {
  failed = true;
  console.error(`FAILED ${name}: ${e.stack || e}`);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
