//! Browser tests: runs one case of web/tests/cases.mjs (`node
//! web/tests/run.mjs NAME`), which drives Debian's /usr/bin/chromium with
//! playwright-core against servers this harness started.
//!
//! The case gets what it needs as JSON in `TETHER_WEB_TEST`. It can ask the
//! test to act (cut the connections, say) by printing `@WHAT`; the test
//! runs the matching action and answers `done WHAT` on the case's stdin.
//! `result {...}` lines are the case's measurements. A missing Chromium,
//! Node.js or `npm ci` is a loud failure, never a skip.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::process;

/// How long one case may take, Chromium's start included.
const CASE_TIMEOUT: Duration = Duration::from_secs(300);

/// web/ in this checkout.
pub fn web_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("web")
}

/// Where the cases save their screenshots: under Cargo's target directory,
/// so a test run leaves the checkout as it was. The README's pictures in
/// docs/images are copied from here by hand when the page changes.
pub fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).expect("create the screenshot directory");
    dir
}

/// Panics unless Chromium, Node.js and web/node_modules are there.
pub fn require_browser() -> PathBuf {
    let chromium = std::env::var_os("TETHER_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| "/usr/bin/chromium".into());
    assert!(
        process::is_executable(&chromium),
        "{} not found: install the Debian packages `chromium chromium-driver` \
         (apt-get install -y chromium chromium-driver); scripts/test installs them when run as root",
        chromium.display()
    );
    process::require_binary("node", "nodejs");
    assert!(
        web_dir().join("node_modules/playwright-core").is_dir(),
        "web/node_modules is missing: run `npm ci` in web/ (scripts/test does)"
    );
    chromium
}

/// Runs case `name` with `env` as its TETHER_WEB_TEST; `actions` answer its
/// `@WHAT` requests. Returns its `result` JSON; panics with its output if it fails.
pub async fn run_case(name: &str, env: Value, actions: &[(&str, &dyn Fn())]) -> Value {
    let chromium = require_browser();
    let mut command = Command::new("node");
    command
        .arg("tests/run.mjs")
        .arg(name)
        .current_dir(web_dir())
        .env("TETHER_WEB_TEST", env.to_string())
        .env("TETHER_CHROMIUM", chromium)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = process::spawn_tied(command, None).expect("spawn node");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = tokio::time::Instant::now() + CASE_TIMEOUT;
    let mut output = Vec::new();
    let mut result = Value::Null;
    loop {
        match tokio::time::timeout_at(deadline, lines.recv()).await {
            Err(_) => {
                let _ = child.kill();
                panic!("browser case {name} still running after {CASE_TIMEOUT:?}; its output:\n{}", output.join("\n"));
            }
            Ok(None) => break,
            Ok(Some(line)) => {
                if let Some(what) = line.strip_prefix('@') {
                    let (_, action) = actions.iter().find(|(w, _)| *w == what).unwrap_or_else(|| {
                        panic!("browser case {name} asked for `{what}`, which this test does not do")
                    });
                    action();
                    writeln!(stdin, "done {what}").expect("answer the case");
                } else if let Some(json) = line.strip_prefix("result ") {
                    result = serde_json::from_str(json).expect("result JSON");
                }
                output.push(line);
            }
        }
    }
    let status = process::wait_timeout(&mut child, Duration::from_secs(30)).expect("node exits");
    let errors = errors.join().unwrap_or_default();
    assert!(status.success(), "browser case {name} failed ({status}):\n{}\n{errors}", output.join("\n"));
    eprintln!("browser case {name}: {}", output.join(" | "));
    result
}

/// Runs the page's unit tests (`node --test web/tests/unit.test.mjs`);
/// panics with their report if one fails.
pub fn run_unit_tests() {
    process::require_binary("node", "nodejs");
    let out = Command::new("node")
        .args(["--test", "tests/unit.test.mjs"])
        .current_dir(web_dir())
        .output()
        .expect("run node --test");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the page's unit tests failed:\n{report}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(report.contains("# fail 0"), "{report}");
}
