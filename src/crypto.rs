//! Host credentials at rest (docs/REST.md, "Daemon requests"; docs/ARCHITECTURE.md,
//! "Where state lives"): AES-256-GCM with the key from
//! `encryption.key`, a random 96-bit nonce per write, and the host id as
//! associated data so a ciphertext cannot be moved to another host's row.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use rand::RngCore;
use uuid::Uuid;

use crate::store::SealedCredentials;

/// Sealing or opening failed (wrong key, tampered row).
#[derive(Debug, thiserror::Error)]
#[error("credentials could not be {0}")]
pub struct CryptoError(&'static str);

pub fn seal(key: &[u8; 32], host_id: Uuid, plaintext: &[u8]) -> Result<SealedCredentials, CryptoError> {
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key));
    let mut nonce = [0u8; 12];
    rand::rng().fill_bytes(&mut nonce);
    let ciphertext = cipher
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad: host_id.as_bytes() })
        .map_err(|_| CryptoError("sealed"))?;
    Ok(SealedCredentials { nonce: nonce.to_vec(), ciphertext })
}

pub fn open(key: &[u8; 32], host_id: Uuid, sealed: &SealedCredentials) -> Result<Vec<u8>, CryptoError> {
    if sealed.nonce.len() != 12 {
        return Err(CryptoError("opened"));
    }
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key));
    cipher
        .decrypt(Nonce::from_slice(&sealed.nonce), Payload { msg: &sealed.ciphertext, aad: host_id.as_bytes() })
        .map_err(|_| CryptoError("opened"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_binding() {
        let key = [7u8; 32];
        let host = Uuid::new_v4();
        let sealed = seal(&key, host, b"{\"token\":\"s3cret\"}").unwrap();
        assert!(!sealed.ciphertext.windows(6).any(|w| w == b"s3cret"), "ciphertext must not contain the secret");
        assert_eq!(open(&key, host, &sealed).unwrap(), b"{\"token\":\"s3cret\"}");
        assert!(open(&[8u8; 32], host, &sealed).is_err(), "wrong key");
        assert!(open(&key, Uuid::new_v4(), &sealed).is_err(), "another host's row");
    }
}
