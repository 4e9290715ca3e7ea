//! Fuzzes what a daemon sends (see `tether_fuzz::daemon_frame`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::daemon_frame(data));
