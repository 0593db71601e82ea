//! What `cargo xtask test` needs from the system, found — and where possible provided — before
//! anything is built.
//!
//! - **Debian packages.** The verbs bindings of `transport-ib` compile rdma-core with cmake and
//!   clang against libibverbs and libnl; the host simulation of the channel kernels needs a C++
//!   compiler; NVRTC comes through pip. The InfiniBand guest adds QEMU and the guest's userland.
//!   Missing packages are installed with `apt-get` when this runs as root; otherwise the exact
//!   command is printed and the test stops before building.
//! - **NVRTC 13.0 and 12.2**, the CUDA runtime compiler alone (no toolkit), from PyPI into a
//!   cache folder ([`cache_dir`]), so the kernel tests compile every kernel on a machine with no
//!   GPU: 13.0 for the suite, 12.2 once more for the kernels crate (what a CUDA 12 driver loads).
//!   Without them (no network) those tests report that they did not run — and under `CI` fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Packages every test run needs: the verbs bindings' build (cmake with make, clang, libclang, the verbs and
/// netlink headers, pkg-config, python3 for rdma-core's build), a C++ compiler for the host
/// simulation of the channel kernels, and pip for NVRTC.
const BUILD_PACKAGES: &[&str] = &[
    "cmake",
    "make",
    "clang",
    "libclang-dev",
    "libibverbs-dev",
    "libnl-3-dev",
    "libnl-route-3-dev",
    "pkg-config",
    "python3",
    "python3-pip",
    "g++",
];

/// Packages of the InfiniBand guest (`transport-ib/vm/softroce-guest.sh`): QEMU, and what its
/// initramfs is made of (busybox, dash, kmod, iproute2, rdma-core's tools and rxe provider).
pub(crate) const GUEST_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "perftest",
    "cpio",
    "kmod",
    "dash",
    "iproute2",
];

/// One NVRTC release from PyPI: the distribution, its pinned version and the library it holds.
struct NvrtcRelease {
    distribution: &'static str,
    version: &'static str,
    library: &'static str,
}

/// The NVRTC the suite runs with (a CUDA 13 driver's).
const NVRTC_13: NvrtcRelease =
    NvrtcRelease { distribution: "nvidia-cuda-nvrtc", version: "13.0.88", library: "libnvrtc.so.13" };

/// The NVRTC of a CUDA 12 driver, for the second compile of every kernel.
const NVRTC_12: NvrtcRelease =
    NvrtcRelease { distribution: "nvidia-cuda-nvrtc-cu12", version: "12.2.140", library: "libnvrtc.so.12" };

/// What was found or provided: the folders holding each NVRTC library, where there is one.
#[derive(Debug, Default)]
pub(crate) struct Provided {
    /// The folder of `libnvrtc.so.13`.
    pub(crate) nvrtc_13: Option<PathBuf>,
    /// The folder of `libnvrtc.so.12`.
    pub(crate) nvrtc_12: Option<PathBuf>,
}

/// Checks the system packages (with the guest's when `guest`), installing what is missing where
/// this may and `install` allows, then NVRTC. `Err` says what is missing and the command that
/// provides it.
pub(crate) fn provide(guest: bool, ci: bool, install: bool) -> Result<Provided, String> {
    provide_packages(&packages(guest), "cargo xtask test", install)?;
    let nvrtc_13 = provide_nvrtc(&NVRTC_13, ci, install)?;
    let nvrtc_12 = provide_nvrtc(&NVRTC_12, ci, install)?;
    Ok(Provided { nvrtc_13, nvrtc_12 })
}

/// The Debian packages a test run needs; with the InfiniBand guest's when `guest`.
pub(crate) fn packages(guest: bool) -> Vec<&'static str> {
    let mut wanted: Vec<&str> = BUILD_PACKAGES.to_vec();
    if guest {
        wanted.extend_from_slice(GUEST_PACKAGES);
    }
    wanted
}

/// Makes sure the Debian packages `wanted` are installed: installs the missing ones with apt-get
/// when running as root and `install` allows, and otherwise returns the command to run. On a
/// system without dpkg, checks the build tools by name and says which Debian packages they come
/// from.
pub(crate) fn provide_packages(wanted: &[&str], who: &str, install: bool) -> Result<(), String> {
    if !on_path("dpkg-query") {
        return check_tools_without_dpkg(who);
    }
    let missing = missing_packages(wanted)?;
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(" ");
    let command = format!("apt-get install -y --no-install-recommends {list}");
    if !(install && running_as_root() && on_path("apt-get")) {
        return Err(format!(
            "these Debian packages are missing: {list}\nrun, then try again:\n  sudo apt-get update && sudo {command}"
        ));
    }
    println!("{who}: installing the Debian packages it needs: {list}");
    let update = Command::new("apt-get").args(["update", "-qq"]).status();
    if !update.is_ok_and(|s| s.success()) {
        return Err(format!("apt-get update failed; run `apt-get update && {command}` and try again"));
    }
    let status = Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("could not run apt-get: {e}"))?;
    if !status.success() {
        return Err(format!("`{command}` failed ({status}); run it to see why"));
    }
    let still = missing_packages(&missing)?;
    if !still.is_empty() {
        return Err(format!("apt-get ran but these packages are still missing: {}", still.join(" ")));
    }
    println!("{who}: installed {list}");
    Ok(())
}

/// The packages of `wanted` that dpkg does not list as installed.
fn missing_packages<S: AsRef<str>>(wanted: &[S]) -> Result<Vec<String>, String> {
    let output = Command::new("dpkg-query")
        .args(["-W", "-f", "${Package} ${db:Status-Status}\n"])
        .args(wanted.iter().map(AsRef::as_ref))
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("could not run dpkg-query: {e}"))?;
    let listing = String::from_utf8_lossy(&output.stdout);
    let installed: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, status)| *status == "installed")
        .map(|(name, _)| name.split(':').next().unwrap_or(name))
        .collect();
    Ok(wanted.iter().map(AsRef::as_ref).filter(|w| !installed.contains(w)).map(str::to_string).collect())
}

/// Without dpkg (not Debian): the tools the build runs must be on `PATH`; the libraries cannot be
/// checked, so the message names the Debian packages to find the equivalents of.
fn check_tools_without_dpkg(who: &str) -> Result<(), String> {
    let tools = ["cmake", "clang", "pkg-config", "python3", "c++"];
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !on_path(t)).collect();
    if missing.is_empty() {
        println!(
            "{who}: no dpkg here, so the libraries cannot be checked; the build needs the equivalents of \
             Debian's {}",
            BUILD_PACKAGES.join(" ")
        );
        return Ok(());
    }
    Err(format!(
        "{} not found on PATH; install them (the Debian packages are: {})",
        missing.join(", "),
        BUILD_PACKAGES.join(" ")
    ))
}

/// The folder the tools fetched for the tests are kept in: `$WEAVE_TOOLS_CACHE`, else
/// `$XDG_CACHE_HOME/weave`, else `$HOME/.cache/weave`, else `target/tools`.
pub(crate) fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WEAVE_TOOLS_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("weave");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".cache/weave");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools")
}

/// The folder holding `release`'s library, installing it from PyPI first when the cache lacks
/// it. `Ok(None)`: it could not be had and `ci` is not set (the kernel tests will say they did
/// not run).
fn provide_nvrtc(release: &NvrtcRelease, ci: bool, install: bool) -> Result<Option<PathBuf>, String> {
    let dir = cache_dir().join(format!("nvrtc-{}", release.version));
    if let Some(found) = find_file(&dir, release.library, 6) {
        return Ok(found.parent().map(Path::to_path_buf));
    }
    let wanted = format!("{}=={}", release.distribution, release.version);
    let command = format!("python3 -m pip install --no-deps --target {} {wanted}", dir.display());
    if !install {
        let message = format!("NVRTC {} is not in {}: run `{command}`", release.version, dir.display());
        return if ci {
            Err(message)
        } else {
            println!("cargo xtask test: {message}");
            Ok(None)
        };
    }
    println!("cargo xtask test: installing NVRTC {} ({wanted} from PyPI) into {}", release.version, dir.display());
    let _ = std::fs::remove_dir_all(&dir);
    let installed = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--target"])
        .arg(&dir)
        .arg(&wanted)
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .status();
    let found = find_file(&dir, release.library, 6);
    match (installed, found) {
        (Ok(s), Some(found)) if s.success() => {
            println!("cargo xtask test: installed {} in {}", release.library, found.display());
            Ok(found.parent().map(Path::to_path_buf))
        }
        (outcome, _) => {
            let why = match outcome {
                Ok(s) => format!("pip exited with {s}"),
                Err(e) => format!("python3 could not be run: {e}"),
            };
            let message = format!("NVRTC {} could not be installed ({why}): run `{command}`", release.version);
            if ci {
                Err(message)
            } else {
                println!("cargo xtask test: {message}; the kernel compile tests will report that they did not run");
                Ok(None)
            }
        }
    }
}

/// The first file named `name` under `dir`, at most `depth` folders down.
fn find_file(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut folders = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name() == name {
            return Some(path);
        }
        if depth > 0 && entry.file_type().is_ok_and(|t| t.is_dir()) {
            folders.push(path);
        }
    }
    folders.into_iter().find_map(|f| find_file(&f, name, depth - 1))
}

/// Whether `name` is an executable file in a folder of `PATH`.
pub(crate) fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Whether this process runs as root (its real uid in `/proc/self/status` is 0).
pub(crate) fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
        s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().next()) == Some("0")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_found_a_few_folders_down_and_not_deeper() {
        let root = std::env::temp_dir().join(format!("weave-find-file-{}", std::process::id()));
        let deep = root.join("nvidia/cu13/lib");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("libnvrtc.so.13"), b"").unwrap();
        assert_eq!(find_file(&root, "libnvrtc.so.13", 3), Some(deep.join("libnvrtc.so.13")));
        assert_eq!(find_file(&root, "libnvrtc.so.13", 1), None, "two folders too deep");
        assert_eq!(find_file(&root, "libnvrtc.so.12", 6), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_package_that_does_not_exist_is_missing_and_an_installed_one_is_not() {
        if !on_path("dpkg-query") {
            println!("SKIPPED: no dpkg-query here");
            return;
        }
        let missing = missing_packages(&["dpkg", "weave-no-such-package"]).unwrap();
        assert_eq!(missing, vec!["weave-no-such-package".to_string()]);
    }
}
