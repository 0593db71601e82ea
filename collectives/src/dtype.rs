//! Element types a collective can move and reduce.

use half::{bf16, f16};

use crate::fp8::{F8E4M3, F8E5M2};

/// The element type of a buffer, as named in benchmark tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f64`.
    F64,
    /// `f32`.
    F32,
    /// IEEE half precision ([`half::f16`]).
    F16,
    /// bfloat16 ([`half::bf16`]).
    Bf16,
    /// `i64`.
    I64,
    /// `i32`.
    I32,
    /// `u64`.
    U64,
    /// `u32`.
    U32,
    /// `i8`.
    I8,
    /// `u8`.
    U8,
    /// 8-bit float, 4 exponent and 3 mantissa bits ([`F8E4M3`]); reduced in `f32`.
    F8E4M3,
    /// 8-bit float, 5 exponent and 2 mantissa bits ([`F8E5M2`]); reduced in `f64`.
    F8E5M2,
}

impl DataType {
    /// Every data type.
    pub const ALL: [DataType; 12] = [
        DataType::F64,
        DataType::F32,
        DataType::F16,
        DataType::Bf16,
        DataType::I64,
        DataType::I32,
        DataType::U64,
        DataType::U32,
        DataType::I8,
        DataType::U8,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I8 | DataType::U8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
        }
    }

    /// The name nccl-tests prints (`float`, `half`, `bfloat16`, `int32`, …).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F64 => "double",
            DataType::F32 => "float",
            DataType::F16 => "half",
            DataType::Bf16 => "bfloat16",
            DataType::I64 => "int64",
            DataType::I32 => "int32",
            DataType::U64 => "uint64",
            DataType::U32 => "uint32",
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }

    /// True for floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F64 | DataType::F32 | DataType::F16 | DataType::Bf16 | DataType::F8E4M3 | DataType::F8E5M2
        )
    }

    /// The type reductions of this type are carried in: `f32` for [`F8E4M3`], `f64` for
    /// [`F8E5M2`] (inputs widened, the result narrowed once: see [`crate::fp8`]), the type
    /// itself for every other.
    pub const fn reduced_in(self) -> DataType {
        match self {
            DataType::F8E4M3 => DataType::F32,
            DataType::F8E5M2 => DataType::F64,
            other => other,
        }
    }

    /// Parses a name as printed by [`name`](Self::name), or the Rust name (`f32`, `bf16`, …).
    pub fn parse(s: &str) -> Option<DataType> {
        let s = s.trim().to_ascii_lowercase();
        DataType::ALL.into_iter().find(|t| t.name() == s || t.rust_name() == s)
    }

    /// The Rust type name (`f32`, `bf16`, …).
    pub const fn rust_name(self) -> &'static str {
        match self {
            DataType::F64 => "f64",
            DataType::F32 => "f32",
            DataType::F16 => "f16",
            DataType::Bf16 => "bf16",
            DataType::I64 => "i64",
            DataType::I32 => "i32",
            DataType::U64 => "u64",
            DataType::U32 => "u32",
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }
}

/// Code generic over the element type, run for a type known only at run time: implement it
/// and pass it to [`DataType::run`], which calls [`run`](Self::run) with the matching Rust type.
///
/// ```
/// use collectives::{DataType, Element, ForEachElement};
///
/// /// The bytes of a buffer of this many elements.
/// struct Bytes(usize);
/// impl ForEachElement for Bytes {
///     type Output = usize;
///     fn run<T: Element>(self) -> usize {
///         self.0 * std::mem::size_of::<T>()
///     }
/// }
/// assert_eq!(DataType::Bf16.run(Bytes(3)), 6);
/// ```
pub trait ForEachElement {
    /// What the code returns.
    type Output;
    /// The code, for the element type `T`.
    fn run<T: Element>(self) -> Self::Output;
}

impl DataType {
    /// Runs `code` with the Rust type of this data type (see [`ForEachElement`]).
    pub fn run<C: ForEachElement>(self, code: C) -> C::Output {
        match self {
            DataType::F64 => code.run::<f64>(),
            DataType::F32 => code.run::<f32>(),
            DataType::F16 => code.run::<f16>(),
            DataType::Bf16 => code.run::<bf16>(),
            DataType::I64 => code.run::<i64>(),
            DataType::I32 => code.run::<i32>(),
            DataType::U64 => code.run::<u64>(),
            DataType::U32 => code.run::<u32>(),
            DataType::I8 => code.run::<i8>(),
            DataType::U8 => code.run::<u8>(),
            DataType::F8E4M3 => code.run::<F8E4M3>(),
            DataType::F8E5M2 => code.run::<F8E5M2>(),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that collectives accept as an element. Implemented for `f64`, `f32`,
/// [`half::f16`], [`half::bf16`], `i64`, `i32`, `u64`, `u32`, `i8`, `u8`, [`F8E4M3`] and
/// [`F8E5M2`].
pub trait Element:
    crate::reduce::Arith + Copy + Send + Sync + PartialOrd + Default + std::fmt::Debug + sealed::Sealed + 'static
{
    /// The matching [`DataType`].
    const DTYPE: DataType;
    /// Converts to `f64` (for references and checks).
    fn to_f64(self) -> f64;
    /// Converts from `f64`, rounding (floats) or wrapping (integers, after truncation).
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:ident, $to:expr, $from:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            #[inline]
            fn to_f64(self) -> f64 {
                let f: fn($t) -> f64 = $to;
                f(self)
            }
            #[inline]
            fn from_f64(v: f64) -> Self {
                let f: fn(f64) -> $t = $from;
                f(v)
            }
        }
    };
}

element!(f64, F64, |x| x, |v| v);
element!(f32, F32, |x| x as f64, |v| v as f32);
element!(f16, F16, |x| x.to_f64(), f16::from_f64);
element!(bf16, Bf16, |x| x.to_f64(), bf16::from_f64);
element!(i64, I64, |x| x as f64, |v| v as i128 as i64);
element!(i32, I32, |x| x as f64, |v| v as i64 as i32);
element!(u64, U64, |x| x as f64, |v| v as i128 as u64);
element!(u32, U32, |x| x as f64, |v| v as i64 as u32);
element!(i8, I8, |x| x as f64, |v| v as i64 as i8);
element!(u8, U8, |x| x as f64, |v| v as i64 as u8);
element!(F8E4M3, F8E4M3, |x| x.to_f64(), F8E4M3::from_f64);
element!(F8E5M2, F8E5M2, |x| x.to_f64(), F8E5M2::from_f64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_names_and_parsing_agree() {
        for t in DataType::ALL {
            assert_eq!(DataType::parse(t.name()), Some(t));
            assert_eq!(DataType::parse(t.rust_name()), Some(t));
        }
        assert_eq!(DataType::parse("complex"), None);
        assert_eq!(<bf16 as Element>::DTYPE.size(), 2);
        assert_eq!(std::mem::size_of::<f16>(), DataType::F16.size());
        assert_eq!(i8::from_f64(300.0), 44); // wraps after truncation
    }

    #[test]
    fn run_calls_the_code_with_the_matching_type() {
        struct Named;
        impl ForEachElement for Named {
            type Output = (DataType, usize);
            fn run<T: Element>(self) -> (DataType, usize) {
                (T::DTYPE, std::mem::size_of::<T>())
            }
        }
        for t in DataType::ALL {
            assert_eq!(t.run(Named), (t, t.size()));
        }
    }
}
