//! Randomness from the operating system ([`getrandom`]): bootstrap tokens, the random
//! part of claim names, jitter. (UUID bytes are not random throughout: a version-4 UUID
//! fixes six of its bits.)

/// `N` random bytes.
pub(crate) fn bytes<const N: usize>() -> Result<[u8; N], getrandom::Error> {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bit_of_the_random_bytes_varies() {
        // Over 64 draws of 16 bytes, each bit is 1 at least once and 0 at least once
        // (a fixed bit, as in UUID bytes, would fail; chance of a false failure ~2^-57).
        let mut ones = [0u8; 16];
        let mut zeros = [0u8; 16];
        for _ in 0..64 {
            let b: [u8; 16] = bytes().expect("the OS gives random bytes");
            for i in 0..16 {
                ones[i] |= b[i];
                zeros[i] |= !b[i];
            }
        }
        assert_eq!(ones, [0xff; 16]);
        assert_eq!(zeros, [0xff; 16]);
    }
}
