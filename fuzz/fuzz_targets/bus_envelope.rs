//! Fuzzes what arrives from the bus (see `tether_fuzz::bus_envelope`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tether_fuzz::bus_envelope(data));
