//! Fuzzes the config loader: a TOML file parsed into `Settings` by the
//! same `Settings::load_from` the server runs (which validates), then the
//! accessors that read parsed settings.
#![no_main]
use std::collections::HashMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tether::config::Settings;

fn path() -> &'static std::path::PathBuf {
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    PATH.get_or_init(|| std::env::temp_dir().join(format!("tether-fuzz-config-{}.toml", std::process::id())))
}

fuzz_target!(|data: &[u8]| {
    let path = path();
    std::fs::write(path, data).expect("write the config file");
    let Ok(settings) = Settings::load_from(Some(path), &HashMap::new()) else { return };
    let _ = settings.listen_addr();
    let _ = settings.cluster_nodes();
    let _ = settings.encryption_key();
    let _ = settings.reserve_pool_size();
});
