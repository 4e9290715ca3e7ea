//! Booking tickets (docs/CELLS.md, "Booking tickets"): the director's proof,
//! carried in `hello.booking.ticket`, that it booked this host of this user
//! onto this cell at this epoch until a given time. A cell checks it with the cluster
//! secret alone, so a booked hello needs no database read.
//!
//! A ticket is base64url (no padding) of `version (1 byte) || expiry (unix
//! ms, 8 bytes big-endian) || HMAC-SHA256 tag (32 bytes)`. The tag covers a
//! fixed label, the host id, the id of the user who owns it, the cell id
//! (length-prefixed), the epoch and the expiry, so a ticket cannot be moved
//! to another host, user, cell or epoch, nor its expiry extended. The host,
//! user, cell and epoch are not in the ticket: the verifier has them (the
//! hello's host, its token's user and booking epoch, its own cell id). The
//! user is what keeps another user's token from saying hello with a ticket
//! it got hold of: the hello's owner check is the ticket's. The tag is compared in constant time. An expired ticket is
//! reported as such only once its tag verified: it still proves which epoch
//! the host was booked at (a redial is admitted from memory at that epoch).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

type HmacSha256 = Hmac<Sha256>;

const VERSION: u8 = 2;
const LABEL: &[u8] = b"tether.booking.v2\0";
const TAG_LEN: usize = 32;
const TICKET_LEN: usize = 1 + 8 + TAG_LEN;

/// What a ticket vouches for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TicketSubject<'a> {
    pub host_id: Uuid,
    /// The host's owner: the user whose token asked for the booking.
    pub user_id: Uuid,
    pub cell_id: &'a str,
    pub epoch: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("the cluster secret is empty")]
    EmptySecret,
    #[error("the booking ticket is malformed")]
    Malformed,
    #[error("the booking ticket was not signed for this host, user, cell and epoch")]
    Forged,
    #[error("the booking ticket expired")]
    Expired { expires_at_ms: i64 },
}

/// The cluster secret, keyed once for signing and checking tickets.
#[derive(Clone)]
pub struct TicketKey {
    mac: HmacSha256,
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TicketKey(..)")
    }
}

impl TicketKey {
    /// Keys `secret` (`cluster.secret`); an empty one would let anyone sign.
    pub fn new(secret: &[u8]) -> Result<Self, TicketError> {
        if secret.is_empty() {
            return Err(TicketError::EmptySecret);
        }
        let mac = HmacSha256::new_from_slice(secret).map_err(|_| TicketError::EmptySecret)?;
        Ok(Self { mac })
    }

    /// A ticket for `subject`, valid until `expires_at_ms` (unix ms).
    pub fn sign(&self, subject: &TicketSubject<'_>, expires_at_ms: i64) -> String {
        let tag = self.tag(subject, expires_at_ms).finalize().into_bytes();
        let mut ticket = Vec::with_capacity(TICKET_LEN);
        ticket.push(VERSION);
        ticket.extend_from_slice(&expires_at_ms.to_be_bytes());
        ticket.extend_from_slice(&tag);
        URL_SAFE_NO_PAD.encode(ticket)
    }

    /// Checks `ticket` for `subject` at `now_ms`; returns its expiry.
    pub fn verify(&self, ticket: &str, subject: &TicketSubject<'_>, now_ms: i64) -> Result<i64, TicketError> {
        let bytes = URL_SAFE_NO_PAD.decode(ticket).map_err(|_| TicketError::Malformed)?;
        if bytes.len() != TICKET_LEN || bytes[0] != VERSION {
            return Err(TicketError::Malformed);
        }
        let mut expiry = [0u8; 8];
        expiry.copy_from_slice(&bytes[1..9]);
        let expires_at_ms = i64::from_be_bytes(expiry);
        self.tag(subject, expires_at_ms).verify_slice(&bytes[9..]).map_err(|_| TicketError::Forged)?;
        if now_ms >= expires_at_ms {
            return Err(TicketError::Expired { expires_at_ms });
        }
        Ok(expires_at_ms)
    }

    fn tag(&self, subject: &TicketSubject<'_>, expires_at_ms: i64) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(LABEL);
        mac.update(subject.host_id.as_bytes());
        mac.update(subject.user_id.as_bytes());
        let cell_len = u32::try_from(subject.cell_id.len()).unwrap_or(u32::MAX);
        mac.update(&cell_len.to_be_bytes());
        mac.update(subject.cell_id.as_bytes());
        mac.update(&subject.epoch.to_be_bytes());
        mac.update(&expires_at_ms.to_be_bytes());
        mac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn key() -> TicketKey {
        TicketKey::new(b"cluster secret").expect("key")
    }

    fn subject(cell_id: &str, epoch: i64) -> TicketSubject<'_> {
        TicketSubject { host_id: Uuid::from_u128(7), user_id: Uuid::from_u128(70), cell_id, epoch }
    }

    #[test]
    fn a_signed_ticket_verifies_until_it_expires() {
        let ticket = key().sign(&subject("cell-a", 3), NOW + 30_000);
        assert!(ticket.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{ticket}");
        assert_eq!(key().verify(&ticket, &subject("cell-a", 3), NOW), Ok(NOW + 30_000));
        assert_eq!(
            key().verify(&ticket, &subject("cell-a", 3), NOW + 30_000),
            Err(TicketError::Expired { expires_at_ms: NOW + 30_000 })
        );
    }

    #[test]
    fn a_ticket_is_bound_to_its_host_user_cell_epoch_and_secret() {
        let ticket = key().sign(&subject("cell-a", 3), NOW + 30_000);
        let forged = Err(TicketError::Forged);
        assert_eq!(key().verify(&ticket, &subject("cell-b", 3), NOW), forged);
        assert_eq!(key().verify(&ticket, &subject("cell-a", 4), NOW), forged);
        let other_host = TicketSubject { host_id: Uuid::from_u128(8), ..subject("cell-a", 3) };
        assert_eq!(key().verify(&ticket, &other_host, NOW), forged);
        let other_user = TicketSubject { user_id: Uuid::from_u128(71), ..subject("cell-a", 3) };
        assert_eq!(key().verify(&ticket, &other_user, NOW), forged);
        let other_secret = TicketKey::new(b"another secret").expect("key");
        assert_eq!(other_secret.verify(&ticket, &subject("cell-a", 3), NOW), forged);
    }

    #[test]
    fn a_tampered_ticket_is_refused() {
        let ticket = key().sign(&subject("cell-a", 3), NOW - 1);
        let mut bytes = URL_SAFE_NO_PAD.decode(&ticket).expect("base64");
        // Extending an expired ticket's expiry breaks its tag.
        bytes[1..9].copy_from_slice(&(NOW + 60_000).to_be_bytes());
        let extended = URL_SAFE_NO_PAD.encode(&bytes);
        assert_eq!(key().verify(&extended, &subject("cell-a", 3), NOW), Err(TicketError::Forged));
        for at in [9, TICKET_LEN - 1] {
            let mut flipped = URL_SAFE_NO_PAD.decode(&ticket).expect("base64");
            flipped[at] ^= 1;
            let flipped = URL_SAFE_NO_PAD.encode(&flipped);
            assert_eq!(key().verify(&flipped, &subject("cell-a", 3), NOW - 10), Err(TicketError::Forged));
        }
    }

    #[test]
    fn malformed_tickets_and_an_empty_secret_are_refused() {
        let ticket = key().sign(&subject("cell-a", 3), NOW + 30_000);
        for bad in ["", "not base64!", &ticket[..ticket.len() - 2], "AA"] {
            assert_eq!(key().verify(bad, &subject("cell-a", 3), NOW), Err(TicketError::Malformed), "{bad:?}");
        }
        let mut other_version = URL_SAFE_NO_PAD.decode(&ticket).expect("base64");
        // Version 1 tickets did not name the user.
        other_version[0] = 1;
        let other_version = URL_SAFE_NO_PAD.encode(&other_version);
        assert_eq!(key().verify(&other_version, &subject("cell-a", 3), NOW), Err(TicketError::Malformed));
        assert_eq!(TicketKey::new(b"").map(|_| ()), Err(TicketError::EmptySecret));
    }
}
