//! Users, password hashes and personal access tokens.
//!
//! Passwords and tokens are stored only as argon2 hashes (PHC strings). The root user is
//! `iggy`, created on first start with a configured or generated password.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use rand::Rng;

pub use cairn_machine::users::{PASSWORD_LEN, ROOT_USER_ID, TOKEN_NAME_LEN, USER_STATUS_ACTIVE, User};

/// Hash a secret with argon2id and a random salt.
pub fn hash_secret(secret: &str) -> Result<String, String> {
    let mut salt_bytes = [0u8; 16];
    rand::thread_rng().fill(&mut salt_bytes);
    let salt = SaltString::encode_b64(&salt_bytes).map_err(|e| e.to_string())?;
    Argon2::default()
        .hash_password(secret.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| e.to_string())
}

/// Check a secret against a stored hash. A malformed stored hash never verifies.
pub fn verify_secret(secret: &str, stored_hash: &str) -> bool {
    match PasswordHash::new(stored_hash) {
        Ok(parsed) => Argon2::default()
            .verify_password(secret.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

/// A random secret of `len` characters from an unambiguous alphabet.
pub fn random_secret(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut rng = rand::thread_rng();
    (0..len)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A new raw token. It carries its public id so a login costs one argon2 check, not one
/// per stored token. Format: `cairn_<16 hex digits of id>_<40 random characters>`.
pub fn new_token(token_id: u64) -> String {
    format!("cairn_{token_id:016x}_{}", random_secret(40))
}

/// The id part of a token made by [`new_token`], if the token has that shape.
pub fn token_id(token: &str) -> Option<u64> {
    let rest = token.strip_prefix("cairn_")?;
    let (id_hex, secret) = rest.split_once('_')?;
    if id_hex.len() != 16 || secret.is_empty() {
        return None;
    }
    u64::from_str_radix(id_hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_and_verify() {
        let hash = hash_secret("s3cret").expect("hash");
        assert!(verify_secret("s3cret", &hash));
        assert!(!verify_secret("s3cre", &hash));
        assert!(!verify_secret("s3cret", "not a hash"));
        assert!(!hash.contains("s3cret"));
    }

    #[test]
    fn token_ids_round_trip() {
        let token = new_token(42);
        assert_eq!(token_id(&token), Some(42));
        assert_eq!(token_id("cairn_zz_x"), None);
        assert_eq!(token_id("other"), None);
    }
}
