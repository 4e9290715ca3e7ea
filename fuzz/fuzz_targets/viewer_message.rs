//! Fuzzes a viewer's text frames: the `ClientMessage` JSON the server's
//! viewer actor parses; every grid that parses is within 1..=1000.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tether::viewer_protocol::{ClientMessage, GRID_MAX, GRID_MIN};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(message) = serde_json::from_str::<ClientMessage>(text) else { return };
    match &message {
        ClientMessage::Resize { cols, rows } | ClientMessage::View { cols, rows, .. } => {
            assert!((GRID_MIN..=GRID_MAX).contains(&cols.0) && (GRID_MIN..=GRID_MAX).contains(&rows.0));
        }
        ClientMessage::Input { .. } => {}
    }
    // What parsed survives a round trip (clients build messages this way).
    let again: ClientMessage = serde_json::from_str(&message.to_json()).expect("round trip");
    assert_eq!(again, message);
});
