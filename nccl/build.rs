//! Gives the shared library NCCL's SONAME, so programs linked against `libnccl.so.2` load it.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}
