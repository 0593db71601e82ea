//! Compile-time checks that the C++ side agrees with comm-core, generated from the Rust
//! definitions and appended to every program ([`crate::source::program`]):
//!
//! - for every [`Layout`] in [`comm_core::device::LAYOUTS`]: `sizeof`, `alignof` and the
//!   offset of every field of `weave::<name>`;
//! - the [`DeviceError`] codes (`weave::DeviceError::<Variant>`);
//! - the trigger field widths and type bits of [`comm_core::fifo`], and a few encodings made
//!   by [`Trigger::new`] compared with `weave::encode_trigger`.
//!
//! Each check is a `static_assert` whose message names the struct and field (or constant), so a
//! drift fails the NVRTC compile with a message that says what moved.
//!
//! NVRTC has no `offsetof`; offsets are measured with `WEAVE_OFFSET_OF` (`weave/handles.cuh`).

use std::fmt::Write;

use comm_core::device::{DeviceError, LAYOUTS, Layout};
use comm_core::fifo::{
    MEMORY_ID_BITS, SEMAPHORE_ID_BITS, TRIGGER_OFFSET_BITS, TRIGGER_SIZE_BITS, TRIGGER_TYPE_BITS, Trigger,
    TriggerFields, TriggerType,
};

/// `static_assert`s for the size, alignment and field offsets of each layout, as C++ text.
pub fn layout_checks(layouts: &[Layout]) -> String {
    let mut s = String::new();
    for l in layouts {
        let t = format!("::weave::{}", l.name);
        let _ = writeln!(
            s,
            "static_assert(sizeof({t}) == {size}, \"weave layout drift: sizeof({name}) differs from Rust ({size} bytes)\");",
            size = l.size,
            name = l.name
        );
        let _ = writeln!(
            s,
            "static_assert(alignof({t}) == {align}, \"weave layout drift: alignof({name}) differs from Rust ({align})\");",
            align = l.align,
            name = l.name
        );
        for (field, offset) in l.fields {
            let _ = writeln!(
                s,
                "static_assert(WEAVE_OFFSET_OF({t}, {field}) == {offset}, \"weave layout drift: offset of {name}.{field} differs from Rust ({offset})\");",
                name = l.name
            );
        }
    }
    s
}

/// `static_assert`s for the [`DeviceError`] codes.
pub fn error_code_checks() -> String {
    let mut s = String::new();
    for code in 1..=u8::MAX as u32 {
        if let Some(e) = DeviceError::from_code(code) {
            let _ = writeln!(
                s,
                "static_assert(::weave::DeviceError::{e:?} == {code}u, \"weave drift: DeviceError::{e:?} differs from Rust ({code})\");"
            );
        }
    }
    s
}

fn encoding_check(label: &str, f: TriggerFields) -> String {
    let Ok(t) = Trigger::new(f) else {
        return format!("#error \"weave: sample trigger {label} is not encodable on the Rust side\"\n");
    };
    let [w0, w1] = t.words();
    let cpp = format!(
        "::weave::encode_trigger(::weave::TriggerFields{{{}u, {}ull, {}u, {}ull, {}u, {}ull, {}u}})",
        f.kind.bits(),
        f.size,
        f.src_memory.0,
        f.src_offset,
        f.dst_memory.0,
        f.dst_offset,
        f.semaphore.0
    );
    format!(
        "static_assert({cpp}.w0 == {w0:#x}ull && {cpp}.w1 == {w1:#x}ull, \"weave drift: trigger encoding {label} differs from comm_core::fifo::Trigger\");\n"
    )
}

/// `static_assert`s for the trigger layout: field widths, type bits, and sample encodings.
pub fn trigger_checks() -> String {
    let mut s = String::new();
    for (name, value) in [
        ("TRIGGER_SIZE_BITS", TRIGGER_SIZE_BITS),
        ("TRIGGER_OFFSET_BITS", TRIGGER_OFFSET_BITS),
        ("MEMORY_ID_BITS", MEMORY_ID_BITS),
        ("TRIGGER_TYPE_BITS", TRIGGER_TYPE_BITS),
        ("SEMAPHORE_ID_BITS", SEMAPHORE_ID_BITS),
    ] {
        let _ = writeln!(
            s,
            "static_assert(::weave::{name} == {value}u, \"weave drift: {name} differs from comm_core::fifo ({value})\");"
        );
    }
    for (name, bits) in [("Data", TriggerType::DATA), ("Flag", TriggerType::FLAG), ("Sync", TriggerType::SYNC)] {
        let _ = writeln!(
            s,
            "static_assert(::weave::TriggerType::{name} == {}u, \"weave drift: TriggerType::{name} differs from comm_core::fifo\");",
            bits.bits()
        );
    }
    let max_id = (1u32 << MEMORY_ID_BITS) - 1;
    let max_sem = (1u32 << SEMAPHORE_ID_BITS) - 1;
    let max_off = (1u64 << TRIGGER_OFFSET_BITS) - 1;
    let max_size = (1u64 << TRIGGER_SIZE_BITS) - 1;
    let samples = [
        ("zero", TriggerType::DATA, 0, 0, 0, 0, 0, 0),
        ("max", TriggerType::all(), max_size, max_id, max_off, max_id, max_off, max_sem),
        ("mixed", TriggerType::DATA | TriggerType::FLAG, 0x1234_5678, 0x155, 0x9abc_def0, 0xaa, 0x0fed_cba9, 0x2aa),
        ("sync", TriggerType::SYNC, 0, 3, 0, 7, 0, 1),
    ];
    for (label, kind, size, src, src_offset, dst, dst_offset, sem) in samples {
        s.push_str(&encoding_check(label, TriggerFields::new(kind, size, (src, src_offset), (dst, dst_offset), sem)));
    }
    s
}

/// Every generated check: [`layout_checks`] of [`LAYOUTS`], [`error_code_checks`] and
/// [`trigger_checks`].
pub fn static_checks() -> String {
    let mut s = String::from("// Generated by kernels::layout from comm-core; do not edit.\n");
    s.push_str(&layout_checks(LAYOUTS));
    s.push_str(&error_code_checks());
    s.push_str(&trigger_checks());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_and_field_is_checked() {
        let text = static_checks();
        for l in LAYOUTS {
            assert!(text.contains(&format!("sizeof(::weave::{}) == {}", l.name, l.size)), "{}", l.name);
            assert!(text.contains(&format!("alignof(::weave::{}) == {}", l.name, l.align)), "{}", l.name);
            for (f, off) in l.fields {
                assert!(
                    text.contains(&format!("WEAVE_OFFSET_OF(::weave::{}, {f}) == {off},", l.name)),
                    "{}.{f}",
                    l.name
                );
                assert!(text.contains(&format!("offset of {}.{f} differs", l.name)), "{}.{f}", l.name);
            }
        }
        assert!(text.contains("::weave::DeviceError::SemaphoreTimeout == 1u"));
        assert!(text.contains("::weave::DeviceError::BadArgument == 5u"));
        assert!(text.contains("::weave::SEMAPHORE_ID_BITS == 10u"));
        assert!(!text.contains("#error"), "every sample trigger encodes");
        assert_eq!(text.matches("trigger encoding").count(), 4);
    }

    #[test]
    fn handles_header_declares_every_layout_and_field() {
        let handles = crate::source::HEADERS.iter().find(|(n, _)| *n == "weave/handles.cuh").map(|h| h.1).unwrap_or("");
        for l in LAYOUTS {
            assert!(handles.contains(&format!(" {} {{\n", l.name)), "weave/handles.cuh has no struct {}", l.name);
        }
    }
}
