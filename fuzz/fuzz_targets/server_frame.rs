//! Fuzzes what the server sends a daemon (see `tether_fuzz::server_frame`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::server_frame(data));
