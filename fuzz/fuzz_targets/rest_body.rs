//! Fuzzes REST request bodies: the first byte picks a route, the rest is
//! its body, parsed as the server does (`web::Json` is `serde_json`'s
//! `from_slice`; the kill route's optional body is `parse_optional`), then
//! the same checks the handler runs before it touches the store.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tether::http::body::parse_optional;
use tether::http::rest::{check_dir, hosts, runs, terminals, tokens};

fn allowed() -> Vec<String> {
    vec!["/home/user".to_owned(), "/srv/".to_owned()]
}

fuzz_target!(|data: &[u8]| {
    let Some((route, body)) = data.split_first() else { return };
    match route % 8 {
        0 => {
            if let Ok(b) = serde_json::from_slice::<terminals::CreateTerminal>(body) {
                if b.check().is_ok() {
                    if let Some(dir) = b.dir() {
                        let _ = check_dir(dir, &allowed());
                        let _ = check_dir(dir, &[]);
                    }
                }
            }
        }
        1 => {
            if let Ok(b) = serde_json::from_slice::<terminals::InputBody>(body) {
                let _ = b.check();
            }
        }
        2 => {
            if let Ok(b) = serde_json::from_slice::<terminals::ResizeBody>(body) {
                if let Ok((cols, rows)) = b.grid() {
                    assert!((1..=1000).contains(&cols) && (1..=1000).contains(&rows));
                }
            }
        }
        3 => {
            if let Ok(b) = parse_optional::<terminals::KillBody>(body) {
                if let Ok(signal) = terminals::KillBody::signal(b.as_ref()) {
                    assert!((1..=64).contains(&signal));
                }
            }
        }
        4 => {
            if let Ok(b) = serde_json::from_slice::<runs::CreateRun>(body) {
                if b.check().is_ok() {
                    if let Some(dir) = b.dir() {
                        let _ = check_dir(dir, &allowed());
                    }
                }
            }
        }
        5 => {
            if let Ok(b) = serde_json::from_slice::<hosts::RegisterHost>(body) {
                let _ = b.check();
            }
        }
        6 => {
            if let Ok(b) = serde_json::from_slice::<hosts::DirBody>(body) {
                let _ = b.check();
            }
        }
        _ => {
            if let Ok(b) = serde_json::from_slice::<tokens::CreateToken>(body) {
                let _ = b.check();
            }
        }
    }
});
