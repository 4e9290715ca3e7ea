//! Fuzzes a viewer's text frames (see `tether_fuzz::viewer_message`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::viewer_message(data));
