//! Compiles proto/ into Rust with prost-build, parsing the .proto files with
//! protox so no system `protoc` is needed; and lists the built web page
//! (web/dist, committed; docs/WEB.md) for `include_bytes!`, so the binary
//! serves it without Node.js or files on disk.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["tether/v1/daemon.proto", "tether/v1/bus.proto"], ["proto"])?;
    prost_build::Config::new().bytes(["."]).compile_fds(fds)?;
    embed_web_page()?;
    Ok(())
}

/// Writes `$OUT_DIR/web_assets.rs`: `WEB_ASSETS`, (path under web/dist,
/// bytes) for every file, sorted by path.
fn embed_web_page() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=web/dist");
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("web").join("dist");
    let mut files = Vec::new();
    collect(&root, &root, &mut files)?;
    if !files.iter().any(|(name, _)| name == "index.html") {
        return Err(format!(
            "{} has no index.html: build the page with `npm ci && npm run build` in web/",
            root.display()
        )
        .into());
    }
    files.sort();
    let mut out = String::from("/// The built page, from web/dist.\npub static WEB_ASSETS: &[(&str, &[u8])] = &[\n");
    for (name, path) in &files {
        writeln!(out, "    ({name:?}, include_bytes!({:?})),", path.display().to_string())?;
    }
    out.push_str("];\n");
    std::fs::write(PathBuf::from(std::env::var("OUT_DIR")?).join("web_assets.rs"), out)?;
    Ok(())
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(root, &path, files)?;
        } else if let Ok(relative) = path.strip_prefix(root) {
            files.push((relative.to_string_lossy().replace('\\', "/"), path.clone()));
        }
    }
    Ok(())
}
