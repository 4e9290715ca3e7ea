//! Replays every committed corpus file of every fuzz target
//! (`fuzz/corpus/TARGET/*`) through the target's own body
//! (`fuzz/src/lib.rs`, included here as a module), so the normal test
//! suite runs each target's corpus without cargo-fuzz or a sanitizer build
//! (docs/SECURITY.md, "Fuzzing"). A panic fails the test, naming the file,
//! as it would stop the fuzzer.

#[path = "../fuzz/src/lib.rs"]
mod targets;

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The `[[bin]]` names of fuzz/Cargo.toml: the targets cargo-fuzz knows.
fn declared_targets() -> Vec<String> {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let mut names = Vec::new();
    let mut in_bin = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if let Some(value) = line.strip_prefix("name").map(str::trim).and_then(|l| l.strip_prefix('=')) {
            if in_bin {
                names.push(value.trim().trim_matches('"').to_string());
            }
        }
    }
    names.sort();
    names
}

#[test]
fn every_fuzz_target_is_replayed() {
    let mut replayed: Vec<String> = targets::TARGETS.iter().map(|(name, _)| name.to_string()).collect();
    replayed.sort();
    let declared = declared_targets();
    assert!(!declared.is_empty(), "no [[bin]] in fuzz/Cargo.toml");
    assert_eq!(replayed, declared, "every target in fuzz/Cargo.toml has its body in fuzz/src/lib.rs TARGETS");
}

#[test]
fn every_corpus_file_replays_without_a_panic() {
    let mut failures = Vec::new();
    for (name, target) in targets::TARGETS {
        let dir = fuzz_dir().join("corpus").join(name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("a corpus entry").path())
            .filter(|path| path.is_file())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{}: the target has no committed corpus", dir.display());
        for file in &files {
            let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                failures.push(file.display().to_string());
            }
        }
        println!("{name}: {} corpus files replayed", files.len());
    }
    assert!(failures.is_empty(), "these inputs panicked: {failures:#?}");
}
