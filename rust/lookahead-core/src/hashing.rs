//! A fast, well-mixed hash for `(owner, token)` keys of the indexes.

/// Hashes a pair of 32-bit ids with the MurmurHash3 64-bit finaliser: every output bit depends
/// on every input bit, which hashbrown needs (it takes the bucket from the low bits and the
/// tag from the high bits).
#[inline]
pub(crate) fn pair_hash(owner: u32, token: u32) -> u64 {
    let mut h = (u64::from(owner) << 32) | u64::from(token);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}
