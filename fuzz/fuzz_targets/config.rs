//! Fuzzes the config loader (see `tether_fuzz::config`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::config(data));
