//! The direct program compiled when the crate was built (`build.rs`), embedded in the binary:
//! one CUBIN per architecture, loaded with no NVRTC at all.
//!
//! The build script compiles [`crate::direct::program`] for the architectures in
//! `WEAVE_BUILD_KERNEL_ARCHS` (unset: the build machine's GPUs, else `sm_80,sm_90,sm_100`) when
//! `WEAVE_BUILD_KERNELS` says so: `1` (fail the build without NVRTC), `auto` (when NVRTC loads),
//! `0` (never); unset, `auto` in release builds and never in debug builds.
//! [`note`] says what it did. An image is used only when its [`fingerprint`] is the one of the
//! program this binary would compile (so the layout checks it was compiled with are the ones of
//! this build) and the driver can run the code of the NVRTC that made it.
//!
//! [`fingerprint`]: crate::program_text::fingerprint

/// One embedded image of the direct program.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedImage {
    /// The architecture it was compiled for (`sm_90`).
    pub arch: &'static str,
    /// The NVRTC version that compiled it.
    pub nvrtc: (i32, i32),
    /// [`crate::program_text::fingerprint`] of the program text it was compiled from.
    pub fingerprint: u128,
    /// The CUBIN.
    pub cubin: &'static [u8],
}

mod generated {
    use super::EmbeddedImage;
    include!(concat!(env!("OUT_DIR"), "/embedded_kernels.rs"));
}

/// Every embedded image (none when the build script compiled nothing).
pub fn images() -> &'static [EmbeddedImage] {
    generated::IMAGES
}

/// What the build script did: which architectures it compiled with which NVRTC, in how long,
/// or why it compiled nothing.
pub fn note() -> &'static str {
    generated::NOTE
}

/// `(major, minor)` of an `sm_XY` / `sm_XYZ` architecture name.
fn compute_capability(arch: &str) -> Option<(u32, u32)> {
    let digits = arch.strip_prefix("sm_")?;
    if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (major, minor) = digits.split_at(digits.len() - 1);
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The image a device of architecture `arch` runs, for a driver of CUDA major version
/// `driver_major`: the same major architecture, the highest minor not above the device's (an
/// `sm_80` CUBIN runs on `sm_86` and `sm_89`), compiled by an NVRTC no newer than the driver.
pub fn image_for(
    images: &'static [EmbeddedImage],
    arch: &str,
    driver_major: Option<i32>,
) -> Option<&'static EmbeddedImage> {
    let (major, minor) = compute_capability(arch)?;
    images
        .iter()
        .filter(|i| driver_major.is_none_or(|d| i.nvrtc.0 <= d))
        .filter_map(|i| compute_capability(i.arch).map(|cc| (cc, i)))
        .filter(|((ma, mi), _)| *ma == major && *mi <= minor)
        .max_by_key(|((_, mi), _)| *mi)
        .map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(arch: &'static str, nvrtc: (i32, i32)) -> EmbeddedImage {
        EmbeddedImage { arch, nvrtc, fingerprint: 1, cubin: b"\x7fELF" }
    }

    #[test]
    fn a_device_gets_the_image_of_its_major_architecture_and_driver() {
        let images: &'static [EmbeddedImage] =
            Box::leak(vec![image("sm_80", (13, 0)), image("sm_90", (13, 0)), image("sm_100", (13, 0))].into());
        let arch_of = |arch, driver| image_for(images, arch, driver).map(|i| i.arch);
        assert_eq!(arch_of("sm_90", Some(13)), Some("sm_90"));
        assert_eq!(arch_of("sm_86", Some(13)), Some("sm_80"), "sm_80 code runs on sm_86");
        assert_eq!(arch_of("sm_89", None), Some("sm_80"));
        assert_eq!(arch_of("sm_103", Some(13)), Some("sm_100"));
        assert_eq!(arch_of("sm_120", Some(13)), None, "no image of major 12");
        assert_eq!(arch_of("sm_75", Some(13)), None, "no older minor of major 7");
        assert_eq!(arch_of("sm_90", Some(12)), None, "a CUDA 12 driver cannot run NVRTC 13's code");
        assert_eq!(arch_of("compute_90", Some(13)), None);
        let old: &'static [EmbeddedImage] = Box::leak(vec![image("sm_90", (12, 2)), image("sm_80", (12, 2))].into());
        assert_eq!(image_for(old, "sm_90", Some(12)).map(|i| i.arch), Some("sm_90"));
        assert_eq!(image_for(old, "sm_90", Some(13)).map(|i| i.arch), Some("sm_90"));
    }

    #[test]
    fn the_build_note_is_filled_and_images_are_cubins() {
        assert!(!note().is_empty());
        for i in images() {
            assert_eq!(&i.cubin[..4], b"\x7fELF", "{}", i.arch);
            assert!(compute_capability(i.arch).is_some(), "{}", i.arch);
            assert_eq!(i.fingerprint, crate::program_text::fingerprint(&crate::direct::program()), "{}", i.arch);
        }
    }
}
