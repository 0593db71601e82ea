//! The FP8 conversions of `collectives::fp8` and of the GPU's `kernels/cuda/weave/fp8.cuh` give
//! the same bits: the header is compiled for the host by the system's C++ compiler (`CXX`, else
//! `c++`), converts every 8-bit code and a few hundred thousand doubles (every midpoint between
//! neighbouring values and its neighbours, specials, a spread across and beyond both ranges),
//! and its answers are compared with the Rust ones. So host and device reductions of FP8 round
//! alike. Without a C++ compiler the test fails under `CI` and prints SKIPPED elsewhere.

use std::io::Write;
use std::process::Command;

use collectives::{F8E4M3, F8E5M2};

/// The header under test.
const FP8_HEADER: &str = include_str!("../../kernels/cuda/weave/fp8.cuh");

/// What `fp8.cuh` includes, for the host: inline functions and the integer names.
const HOST_TYPES: &str = "#ifndef WEAVE_TYPES_CUH\n#define WEAVE_TYPES_CUH\n#define WEAVE_DEVICE inline\n\
    namespace weave { typedef unsigned char uint8_t; typedef unsigned int uint32_t; \
    typedef unsigned long long uint64_t; }\n#endif\n";

/// Reads doubles (their bits, one hex number a line) on stdin; prints the widened bits of every
/// code in both formats, then the narrowed code of every double in both formats.
const DRIVER: &str = r#"
#include <cstdio>
#include "weave/fp8.cuh"
int main() {
  for (unsigned c = 0; c < 256; ++c)
    std::printf("%llx %llx\n", (unsigned long long)weave::fp8_double_bits(weave::fp8_to_double(c, weave::FP8_E4M3)),
                (unsigned long long)weave::fp8_double_bits(weave::fp8_to_double(c, weave::FP8_E5M2)));
  unsigned long long bits;
  while (std::scanf("%llx", &bits) == 1) {
    double x = weave::fp8_bits_double(bits);
    std::printf("%x %x\n", weave::fp8_from_double(x, weave::FP8_E4M3), weave::fp8_from_double(x, weave::FP8_E5M2));
  }
  return 0;
}
"#;

/// The doubles both sides narrow.
fn inputs() -> Vec<f64> {
    let mut xs = vec![0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MAX, f64::MIN_POSITIVE, 5e-324];
    for c in 0..0x7fu8 {
        for (lo, hi) in [
            (F8E4M3::from_bits(c).to_f64(), F8E4M3::from_bits(c + 1).to_f64()),
            (F8E5M2::from_bits(c).to_f64(), F8E5M2::from_bits(c + 1).to_f64()),
        ] {
            let mid = (lo + hi) / 2.0;
            if mid.is_finite() {
                xs.extend([mid, mid.next_up(), mid.next_down(), -mid]);
            }
        }
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..200_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let exponent = (state % 72) as i32 - 44;
        let mantissa = 1.0 + (state >> 11) as f64 / (1u64 << 53) as f64;
        xs.push(if state & 1 == 0 { mantissa } else { -mantissa } * 2f64.powi(exponent));
    }
    xs
}

#[test]
fn host_and_device_conversions_give_the_same_bits() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let dir = std::env::temp_dir().join(format!("weave-fp8-{}", std::process::id()));
    let binary = dir.join("fp8");
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir.join("weave"))?;
        std::fs::write(dir.join("weave/types.cuh"), HOST_TYPES)?;
        std::fs::write(dir.join("weave/fp8.cuh"), FP8_HEADER)?;
        std::fs::write(dir.join("driver.cpp"), DRIVER)
    };
    write().unwrap_or_else(|e| panic!("write the sources into {}: {e}", dir.display()));
    let built = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-Wall", "-Werror", "-I"])
        .arg(&dir)
        .arg(dir.join("driver.cpp"))
        .arg("-o")
        .arg(&binary)
        .output();
    let built = match built {
        Ok(b) => b,
        Err(e) if std::env::var_os("CI").is_none() => {
            let _ = writeln!(std::io::stderr(), "SKIPPED: no C++ compiler ({cxx}: {e}); set CXX to one");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        Err(e) => panic!("{cxx}: {e}; CI is set: fp8.cuh must be checked against the Rust conversions in CI"),
    };
    assert!(built.status.success(), "{cxx} could not build fp8.cuh:\n{}", String::from_utf8_lossy(&built.stderr));

    let xs = inputs();
    let stdin: String = xs.iter().map(|x| format!("{:x}\n", x.to_bits())).collect();
    let mut child = Command::new(&binary)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run the conversion driver");
    let mut pipe = child.stdin.take().expect("stdin");
    let feeder = std::thread::spawn(move || pipe.write_all(stdin.as_bytes()));
    let out = child.wait_with_output().expect("the driver's output");
    feeder.join().expect("feeder").expect("write the inputs");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "the driver failed");
    let text = String::from_utf8(out.stdout).expect("text");
    let lines: Vec<(u64, u64)> = text
        .lines()
        .map(|l| {
            let mut w = l.split(' ').map(|h| u64::from_str_radix(h, 16).expect("hex"));
            (w.next().expect("first"), w.next().expect("second"))
        })
        .collect();
    assert_eq!(lines.len(), 256 + xs.len(), "one line per code and per input");

    for (code, &(e4m3, e5m2)) in lines[..256].iter().enumerate() {
        let code = code as u8;
        assert_eq!(e4m3, F8E4M3::from_bits(code).to_f64().to_bits(), "e4m3 code {code:#04x} widens alike");
        assert_eq!(e5m2, F8E5M2::from_bits(code).to_f64().to_bits(), "e5m2 code {code:#04x} widens alike");
    }
    for (&x, &(e4m3, e5m2)) in xs.iter().zip(&lines[256..]) {
        let rust = (u64::from(F8E4M3::from_f64(x).to_bits()), u64::from(F8E5M2::from_f64(x).to_bits()));
        assert_eq!((e4m3, e5m2), rust, "{x:e} ({:#x}) narrows to (e4m3, e5m2) in C++ and in Rust", x.to_bits());
    }
    println!("{} codes and {} doubles convert alike in Rust and in fp8.cuh", 256, xs.len());
}
