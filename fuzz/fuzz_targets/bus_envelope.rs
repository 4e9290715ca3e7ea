//! Fuzzes what arrives from the bus: the `Envelope` decoder every
//! subscriber uses, then `from_wire` of a host request and
//! `answer_from_wire` of a reply, as the owner and the asker check them.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tether::bus::{decode, Inbound};
use tether::proto::bus::{envelope::Body, reply};
use tether::relay::requests::{answer_from_wire, from_wire, HostOp};

fuzz_target!(|data: &[u8]| {
    let Inbound::Message { envelope, .. } = decode("fuzz".to_owned(), data) else { return };
    match envelope.body {
        Some(Body::Request(request)) => {
            if let Some(op) = request.op {
                let _ = from_wire(op);
            }
        }
        Some(Body::Reply(r)) => {
            if let Some(reply::Outcome::Answer(answer)) = r.outcome {
                for op in [HostOp::RefreshLimits, HostOp::RefreshCredentials, HostOp::Dirs { add: true, path: "/".into() }] {
                    let _ = answer_from_wire(&op, answer.clone());
                }
            }
        }
        _ => {}
    }
});
