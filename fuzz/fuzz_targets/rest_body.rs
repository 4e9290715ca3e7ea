//! Fuzzes REST request bodies (see `tether_fuzz::rest_body`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::rest_body(data));
