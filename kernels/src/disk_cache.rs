//! The on-disk kernel cache's entries: one file per key ([`entry_path`]), written to a
//! temporary file and renamed into place ([`store_entry`]) so readers never see half an entry,
//! and read back only when every check holds — magic, format version, key, lengths, checksum,
//! PTX text ([`read_entry`]); anything else is a miss, and the compiler rebuilds the entry.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::program_text::Fnv128;

/// What an entry file starts with.
fn checksum(parts: &[&[u8]]) -> u64 {
    let mut h = Fnv128::new();
    for p in parts {
        h.field(p);
    }
    (h.0 ^ (h.0 >> 64)) as u64
}

const MAGIC: &[u8; 8] = b"WVKCACHE";
/// The entry format, after the magic.
const FORMAT_VERSION: u32 = 1;
/// Magic, version, key, PTX length, CUBIN length, checksum.
const HEADER_LEN: usize = 8 + 4 + 16 + 8 + 8 + 8;

/// The bytes of the entry for `key`: header, PTX, CUBIN (if any).
pub(crate) fn encode_entry(key: u128, ptx: &str, cubin: Option<&[u8]>) -> Vec<u8> {
    let cubin = cubin.unwrap_or(&[]);
    let mut out = Vec::with_capacity(HEADER_LEN + ptx.len() + cubin.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&(ptx.len() as u64).to_le_bytes());
    out.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(&[ptx.as_bytes(), cubin]).to_le_bytes());
    out.extend_from_slice(ptx.as_bytes());
    out.extend_from_slice(cubin);
    out
}

/// Decodes an entry; `None` when anything about it is off.
fn decode_entry(data: &[u8], key: u128) -> Option<(String, Option<Vec<u8>>)> {
    let header = data.get(..HEADER_LEN)?;
    let u64_at = |at: usize| header.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    if &header[..8] != MAGIC || header[8..12] != FORMAT_VERSION.to_le_bytes() || header[12..28] != key.to_le_bytes() {
        return None;
    }
    let ptx_len = usize::try_from(u64_at(28)?).ok()?;
    let cubin_len = usize::try_from(u64_at(36)?).ok()?;
    let sum = u64_at(44)?;
    let body = &data[HEADER_LEN..];
    if body.len() != ptx_len.checked_add(cubin_len)? {
        return None;
    }
    let (ptx, cubin) = body.split_at(ptx_len);
    if checksum(&[ptx, cubin]) != sum || ptx.contains(&0) {
        return None;
    }
    let ptx = String::from_utf8(ptx.to_vec()).ok()?;
    Some((ptx, (!cubin.is_empty()).then(|| cubin.to_vec())))
}

/// The cached result for `key`, when present and intact (with a CUBIN when `need_cubin`).
pub(crate) fn read_entry(dir: &Path, key: u128, need_cubin: bool) -> Option<(String, Option<Vec<u8>>)> {
    let data = fs::read(entry_path(dir, key)).ok()?;
    decode_entry(&data, key).filter(|(_, cubin)| cubin.is_some() || !need_cubin)
}

/// The file of the cache entry for `key` in the cache directory `dir`
/// ([`CompiledKernel::key`](crate::CompiledKernel::key) names a result's key). Each result is one such file, complete in
/// itself, so copying some of them into another cache directory carries those results
/// (`cargo xtask gpu-bundle --kernel-cache` packs the ones the GPU tests need).
pub fn entry_path(dir: &Path, key: u128) -> PathBuf {
    dir.join(format!("{key:032x}.weavekernel"))
}

/// Writes `bytes` as the entry for `key` in `dir`, atomically (temporary file, then rename).
pub(crate) fn store_entry(dir: &Path, key: u128, bytes: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    fs::create_dir_all(dir)?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{key:032x}.{}.{n}.tmp", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, entry_path(dir, key))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_entries_round_trip_and_reject_damage() {
        let key = 0x0123_4567_89ab_cdef_0011_2233_4455_6677u128;
        let e = encode_entry(key, ".version 9.0\n", Some(&[1, 2, 3]));
        assert_eq!(decode_entry(&e, key), Some((".version 9.0\n".to_string(), Some(vec![1, 2, 3]))));
        assert_eq!(decode_entry(&encode_entry(key, "x", None), key), Some(("x".to_string(), None)));
        assert_eq!(decode_entry(&e, key + 1), None, "other key");
        assert_eq!(decode_entry(&e[..e.len() - 1], key), None, "truncated");
        assert_eq!(decode_entry(&e[..10], key), None, "short header");
        for i in [0, 9, 30, 40, 50, HEADER_LEN, e.len() - 1] {
            let mut bad = e.clone();
            bad[i] ^= 0x40;
            assert_eq!(decode_entry(&bad, key), None, "byte {i} flipped");
        }
        let mut longer = e.clone();
        longer.push(0);
        assert_eq!(decode_entry(&longer, key), None, "trailing garbage");
    }
}
