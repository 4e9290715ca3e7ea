//! Compiles proto/ into Rust with prost-build, parsing the .proto files with
//! protox so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["tether/v1/daemon.proto", "tether/v1/bus.proto"], ["proto"])?;
    prost_build::Config::new().bytes(["."]).compile_fds(fds)?;
    Ok(())
}
