//! [`debug_fields!`](crate::debug_fields): a `Debug` that shows some of a struct's fields.
//!
//! Many weave types hold what `#[derive(Debug)]` cannot or should not print (driver handles,
//! threads, sockets, raw pointers), so their `Debug` names the fields that identify a value and
//! ends in `..` for the rest. The macro writes that impl from the list of fields to show.

/// Implements [`Debug`](std::fmt::Debug) for the struct `$type`, printing the listed fields (each
/// by its own `Debug`, in the order given) and `..` for the others, as
/// [`finish_non_exhaustive`](std::fmt::DebugStruct::finish_non_exhaustive) does. An entry
/// `name: |value| ...` prints what the closure makes of the value (a length, a flag) under
/// `name` instead of a field.
///
/// ```
/// struct Link {
///     peer: usize,
///     label: &'static str,
///     socket: std::net::UdpSocket,
///     queue: Vec<u8>,
/// }
/// comm_core::debug_fields!(Link { peer, label, queued: |l| l.queue.len() });
///
/// let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
/// let link = Link { peer: 3, label: "ring", socket, queue: vec![1, 2] };
/// assert_eq!(format!("{link:?}"), r#"Link { peer: 3, label: "ring", queued: 2, .. }"#);
/// ```
#[macro_export]
macro_rules! debug_fields {
    ($type:ident { $($field:ident $(: $view:expr)?),+ $(,)? }) => {
        impl ::std::fmt::Debug for $type {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(::std::stringify!($type))
                    $(.field(
                        ::std::stringify!($field),
                        &$crate::debug_fields!(@value self, $type, $field $(, $view)?),
                    ))+
                    .finish_non_exhaustive()
            }
        }
    };
    (@value $value:ident, $type:ident, $field:ident) => {
        $value.$field
    };
    (@value $value:ident, $type:ident, $field:ident, $view:expr) => {{
        fn view<R>(value: &$type, f: impl FnOnce(&$type) -> R) -> R {
            f(value)
        }
        view($value, $view)
    }};
}
