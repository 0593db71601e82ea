//! The on-disk kernel cache's entries: one file per key ([`entry_path`]), written to a
//! temporary file and renamed into place ([`store_entry`]) so readers never see half an entry,
//! and read back only when every check holds — magic, format version, key, lengths, checksum,
//! PTX text ([`read_entry`]); anything else is a miss, and the compiler rebuilds the entry.
//!
//! What a process loads from the cache runs on its GPU, so only what this user alone could
//! have written is trusted: the directory (made `0700`) and each entry must be this user's and
//! writable by no one else, and an entry must be a regular file no larger than
//! [`MAX_ENTRY_BYTES`] (a pipe, a device or a link is a miss, never a wait or a huge read).
//! Temporary files are created new (`0600`), never through a name someone else placed.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
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

/// The largest entry read back (the whole direct program, PTX and CUBIN, is a few MiB).
pub(crate) const MAX_ENTRY_BYTES: u64 = 256 << 20;

/// Whether `meta` (of the cache directory or an entry) is this user's and writable by no one
/// else.
fn owned_alone(meta: &fs::Metadata) -> bool {
    meta.uid() == nix::unistd::geteuid().as_raw() && meta.mode() & 0o022 == 0
}

/// Whether the cache directory `dir` may be trusted (see the module doc); a directory that
/// may not is used for nothing, and says why once at debug level.
fn trusted_dir(dir: &Path) -> bool {
    let trusted = fs::metadata(dir).is_ok_and(|m| m.is_dir() && owned_alone(&m));
    if !trusted {
        tracing::debug!(target: comm_core::diagnostics::INIT, dir = %dir.display(), "kernel cache directory is not this user's alone: not used");
    }
    trusted
}

/// The cached result for `key`, when present and intact (with a CUBIN when `need_cubin`).
pub(crate) fn read_entry(dir: &Path, key: u128, need_cubin: bool) -> Option<(String, Option<Vec<u8>>)> {
    if !trusted_dir(dir) {
        return None;
    }
    // No link followed, and no wait on a pipe's writer: what is opened is checked below.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(entry_path(dir, key))
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || !owned_alone(&meta) || meta.len() > MAX_ENTRY_BYTES {
        return None;
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_ENTRY_BYTES + 1).read_to_end(&mut data).ok()?;
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
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    if !trusted_dir(dir) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} is not this user's alone (owner, mode): entries are not written there", dir.display()),
        ));
    }
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{key:032x}.{}.{n}.tmp", std::process::id()));
    // Created new: a name someone placed first (a link, another file) fails the write.
    let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    let result = (|| {
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

    #[test]
    fn only_what_this_user_alone_wrote_is_read_and_nothing_hangs() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("weave-disk-cache-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (key, other) = (7u128, 8u128);
        store_entry(&dir, key, &encode_entry(key, "ptx", None)).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&dir), mode(&entry_path(&dir, key))), (0o700, 0o600));
        assert_eq!(read_entry(&dir, key, false), Some(("ptx".to_string(), None)));
        // An entry others may write is not trusted.
        fs::set_permissions(entry_path(&dir, key), fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(read_entry(&dir, key, false), None, "a world-writable entry was read");
        fs::set_permissions(entry_path(&dir, key), fs::Permissions::from_mode(0o600)).unwrap();
        // A link to a good entry, and a pipe with no writer (opening it used to wait for ever).
        std::os::unix::fs::symlink(entry_path(&dir, key), entry_path(&dir, other)).unwrap();
        assert_eq!(read_entry(&dir, other, false), None, "a link was followed");
        fs::remove_file(entry_path(&dir, other)).unwrap();
        nix::unistd::mkfifo(&entry_path(&dir, other), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let started = std::time::Instant::now();
        assert_eq!(read_entry(&dir, other, false), None);
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "reading a pipe waited");
        // A directory others may write is used for nothing.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(read_entry(&dir, key, false), None, "an entry of a world-writable directory was read");
        assert!(store_entry(&dir, other + 1, &encode_entry(other + 1, "ptx", None)).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
