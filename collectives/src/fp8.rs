//! 8-bit floats: [`F8E4M3`] and [`F8E5M2`] (the OCP formats NVIDIA's `__nv_fp8_e4m3` and
//! `__nv_fp8_e5m2` store), and how collectives reduce them.
//!
//! **Conversions** are NVIDIA's with `__NV_SATFINITE`: round to nearest, ties to even; a value
//! beyond the largest finite one (infinity included) saturates to it; NaN becomes `0x7f`.
//! They are written twice, here and in `kernels/cuda/weave/fp8.cuh` for the GPU, in the same
//! integer steps; a test compiles the C++ on the host and checks that both give the same bits.
//!
//! **Reductions round once.** Every reduction of FP8 elements is carried in a wider type: e4m3
//! in `f32`, e5m2 in `f64` ([`DataType::reduced_in`](crate::DataType::reduced_in)). The inputs
//! are widened (exactly), the collective runs on the wide elements with any algorithm, and
//! the result is narrowed once. A sum of e4m3 values is exact in `f32` for up to 73 ranks
//! (each value is a multiple of 2⁻⁹ below 2⁹), and a sum of e5m2 values in `f64` for up to 2²¹
//! (multiples of 2⁻¹⁶ below 2¹⁶), so the order of the additions, and with it the algorithm,
//! the message size and the family, never changes the result: it is the exact sum rounded
//! once. Min and max are exact anyway; a product is exact while its significand fits (6 e4m3
//! or 17 e5m2 factors); an average is the exact sum divided in the wide type, then narrowed.
//! The price is traffic: the wide elements are 4 or 8 times the size.

use std::cmp::Ordering;

/// The layout of an 8-bit float format (`weave::Fp8Format` in `fp8.cuh`).
#[derive(Clone, Copy)]
struct Format {
    mantissa_bits: u32,
    bias: i32,
    /// The magnitude code of the largest finite value.
    max_finite: u8,
    /// Whether the code after `max_finite` is infinity (e5m2) rather than NaN.
    has_infinity: bool,
}

const E4M3: Format = Format { mantissa_bits: 3, bias: 7, max_finite: 0x7e, has_infinity: false };
const E5M2: Format = Format { mantissa_bits: 2, bias: 15, max_finite: 0x7b, has_infinity: true };
/// What a NaN narrows to.
const NAN_CODE: u8 = 0x7f;

/// The value of `code` in format `f`, exactly.
fn decode(code: u8, f: Format) -> f64 {
    let negative = code & 0x80 != 0;
    let magnitude = code & 0x7f;
    let value = if magnitude > f.max_finite {
        if f.has_infinity && magnitude == f.max_finite + 1 { f64::INFINITY } else { f64::NAN }
    } else {
        let exponent_field = i32::from(magnitude >> f.mantissa_bits);
        let fraction = f64::from(magnitude & ((1 << f.mantissa_bits) - 1));
        let step = (1u32 << f.mantissa_bits) as f64;
        if exponent_field == 0 {
            fraction / step * 2f64.powi(1 - f.bias)
        } else {
            (1.0 + fraction / step) * 2f64.powi(exponent_field - f.bias)
        }
    };
    if negative { -value } else { value }
}

/// `x` narrowed to format `f`: the steps of `fp8_from_double` in `fp8.cuh`, one for one.
fn encode(x: f64, f: Format) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 56) as u8) & 0x80;
    let exponent_field = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    if exponent_field == 0x7ff {
        return if fraction != 0 { NAN_CODE } else { sign | f.max_finite };
    }
    // Subnormal doubles are far below half the smallest 8-bit value.
    if exponent_field == 0 {
        return sign;
    }
    let exponent = exponent_field - 1023;
    let significand = fraction | (1 << 52); // |x| = significand × 2^(exponent - 52)
    let min_normal = 1 - f.bias;
    // The spacing of the 8-bit values at |x|: 2^quantum.
    let quantum = exponent.max(min_normal) - f.mantissa_bits as i32;
    let shift = (52 + quantum - exponent) as u32; // at least 52 - mantissa_bits
    if shift >= 54 {
        return sign; // |x| < half the spacing
    }
    let mut q = significand >> shift;
    let rest = significand & ((1 << shift) - 1);
    let half = 1u64 << (shift - 1);
    if rest > half || (rest == half && q & 1 != 0) {
        q += 1;
    }
    // |x| rounds to q × 2^quantum.
    let magnitude = if exponent < min_normal {
        // Subnormal; q = 2^mantissa_bits is the smallest normal, whose code is q too.
        q as u32
    } else {
        let mut e = exponent;
        if q == 2 << f.mantissa_bits {
            q >>= 1;
            e += 1;
        }
        let field = e + f.bias;
        if field > 0x7f >> f.mantissa_bits {
            return sign | f.max_finite;
        }
        ((field as u32) << f.mantissa_bits) | (q - (1 << f.mantissa_bits)) as u32
    };
    sign | magnitude.min(u32::from(f.max_finite)) as u8
}

macro_rules! fp8_type {
    ($(#[$doc:meta])* $name:ident, $format:ident) => {
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Default)]
        pub struct $name(u8);

        impl $name {
            /// The largest finite value.
            pub const MAX: $name = $name($format.max_finite);
            /// The most negative finite value.
            pub const MIN: $name = $name($format.max_finite | 0x80);
            /// Zero.
            pub const ZERO: $name = $name(0);

            /// The value whose encoding is `bits`.
            pub const fn from_bits(bits: u8) -> Self {
                $name(bits)
            }

            /// This value's encoding.
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// `x` rounded to nearest (ties to even), saturating to the largest finite value
            /// (infinities too); NaN gives NaN.
            pub fn from_f64(x: f64) -> Self {
                $name(encode(x, $format))
            }

            /// `x` converted as [`from_f64`](Self::from_f64) does (one rounding: `f32` widens
            /// to `f64` exactly).
            pub fn from_f32(x: f32) -> Self {
                Self::from_f64(f64::from(x))
            }

            /// The value, exactly.
            pub fn to_f64(self) -> f64 {
                decode(self.0, $format)
            }

            /// The value, exactly (every 8-bit value is an `f32`).
            pub fn to_f32(self) -> f32 {
                self.to_f64() as f32
            }

            /// Whether this is a NaN.
            pub fn is_nan(self) -> bool {
                self.to_f64().is_nan()
            }
        }

        impl PartialEq for $name {
            /// Equal as numbers: `-0 == 0`, a NaN equals nothing.
            fn eq(&self, other: &Self) -> bool {
                self.to_f64() == other.to_f64()
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                self.to_f64().partial_cmp(&other.to_f64())
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&self.to_f64(), f)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.to_f64(), f)
            }
        }

        impl From<$name> for f32 {
            fn from(x: $name) -> f32 {
                x.to_f32()
            }
        }

        impl From<$name> for f64 {
            fn from(x: $name) -> f64 {
                x.to_f64()
            }
        }
    };
}

fp8_type!(
    /// An 8-bit float with 4 exponent bits and 3 mantissa bits (bias 7): ±448 at most, no
    /// infinity, `S.1111.111` is NaN. The layout of CUDA's `__nv_fp8_e4m3`.
    F8E4M3,
    E4M3
);

fp8_type!(
    /// An 8-bit float with 5 exponent bits and 2 mantissa bits (bias 15): ±57,344 at most,
    /// `S.11111.00` is infinity, `S.11111.01` to `.11` NaN. The layout of CUDA's `__nv_fp8_e5m2`.
    F8E5M2,
    E5M2
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The nearest finite value of format `f` to `x` by search over every code (ties to the
    /// even code), saturated to the largest finite one: the definition the fast path must meet.
    fn nearest_by_search(x: f64, f: Format) -> u8 {
        if x.is_nan() {
            return NAN_CODE;
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs();
        let mut best = 0u8;
        for code in 0..=f.max_finite {
            let (d, db) = ((decode(code, f) - a).abs(), (decode(best, f) - a).abs());
            if d < db || (d == db && code % 2 == 0 && best % 2 == 1) {
                best = code;
            }
        }
        sign | best
    }

    #[test]
    fn every_code_widens_and_narrows_back_to_itself() {
        for f in [E4M3, E5M2] {
            for code in 0..=255u8 {
                let v = decode(code, f);
                if v.is_nan() {
                    assert_eq!(encode(v, f), NAN_CODE);
                } else if v.is_infinite() {
                    assert_eq!(encode(v, f) & 0x7f, f.max_finite, "infinity saturates");
                } else {
                    assert_eq!(encode(v, f), code, "code {code:#04x} is {v}");
                }
            }
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(F8E4M3::MAX.to_f64(), 448.0);
        assert_eq!(F8E5M2::MAX.to_f64(), 57344.0);
        assert_eq!(F8E4M3::from_bits(0x01).to_f64(), 2f64.powi(-9));
        assert_eq!(F8E5M2::from_bits(0x01).to_f64(), 2f64.powi(-16));
        assert_eq!(F8E4M3::from_f64(1.0).to_bits(), 0x38);
        assert_eq!(F8E5M2::from_f64(1.0).to_bits(), 0x3c);
        assert_eq!(F8E4M3::from_f64(-2.0).to_bits(), 0xc0);
        assert!(F8E4M3::from_bits(0x7f).is_nan() && F8E4M3::from_bits(0xff).is_nan());
        assert_eq!(F8E5M2::from_bits(0x7c).to_f64(), f64::INFINITY);
        // Saturation: past the largest value, infinity included.
        for x in [449.0, 464.0, 1e9, f64::INFINITY] {
            assert_eq!(F8E4M3::from_f64(x).to_bits(), 0x7e, "{x}");
            assert_eq!(F8E4M3::from_f64(-x).to_bits(), 0xfe, "-{x}");
        }
        assert_eq!(F8E5M2::from_f64(1e9).to_bits(), 0x7b);
        assert_eq!(F8E4M3::from_f64(f64::NAN).to_bits(), NAN_CODE);
        // Ties to even: 17 lies between 16 (even code) and 18; 19 between 18 and 20 (even).
        assert_eq!(F8E4M3::from_f64(17.0).to_f64(), 16.0);
        assert_eq!(F8E4M3::from_f64(19.0).to_f64(), 20.0);
        // Signed zero, and tiny values rounding to it keep their sign.
        assert_eq!(F8E4M3::from_f64(-0.0).to_bits(), 0x80);
        assert_eq!(F8E4M3::from_f64(-1e-30).to_bits(), 0x80);
        assert_eq!(F8E4M3::from_f64(0.0), F8E4M3::from_f64(-0.0));
    }

    #[test]
    fn narrowing_is_the_nearest_value_for_many_doubles() {
        // Every exact midpoint and its neighbours, and a spread of pseudo-random doubles across
        // and beyond each format's range.
        let mut xs = Vec::new();
        for f in [E4M3, E5M2] {
            for code in 0..f.max_finite {
                let mid = (decode(code, f) + decode(code + 1, f)) / 2.0;
                xs.extend([mid, mid.next_up(), mid.next_down()]);
            }
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let exponent = (state % 64) as i32 - 40;
            let mantissa = 1.0 + (state >> 11) as f64 / (1u64 << 53) as f64;
            let sign = if state & 1 == 0 { 1.0 } else { -1.0 };
            xs.push(sign * mantissa * 2f64.powi(exponent));
        }
        for f in [E4M3, E5M2] {
            for &x in &xs {
                assert_eq!(encode(x, f), nearest_by_search(x, f), "{x:e} (bits {:#x})", x.to_bits());
            }
        }
    }

    #[test]
    fn order_follows_the_values() {
        let a = F8E4M3::from_f64(-3.0);
        let b = F8E4M3::from_f64(2.0);
        assert!(a < b);
        assert!(b > a);
        assert!(F8E4M3::MIN < F8E4M3::MAX);
        assert!(F8E5M2::from_bits(0x7f).partial_cmp(&F8E5M2::ZERO).is_none());
    }
}
