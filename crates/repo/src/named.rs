//! Enums configured by name (`--type=incr`, `compress-type = "zst"`): one list of values and
//! one of names, in the same order, from which parsing, printing and the option table's
//! allowed values all come.

/// An enum whose values have names. Implementors give [`Named::ALL`] and [`Named::NAMES`]
/// in the same order (the [`named!`](crate::named) macro defines the enum and writes both from its
/// `Variant = "name"` list); `name` and `parse` follow from them.
pub trait Named: Copy + PartialEq + Sized + 'static {
    /// Every value, in the order of [`Named::NAMES`].
    const ALL: &'static [Self];
    /// Every value's name, in the order of [`Named::ALL`].
    const NAMES: &'static [&'static str];

    fn name(self) -> &'static str {
        let i = Self::ALL.iter().position(|v| *v == self);
        Self::NAMES[i.expect("every value is in ALL")]
    }

    fn parse(s: &str) -> Option<Self> {
        let i = Self::NAMES.iter().position(|n| *n == s)?;
        Some(Self::ALL[i])
    }
}

/// Define an enum whose variants each carry their name, and implement [`Named`] for it, so
/// the list of values is written once. The enum derives `Debug, Clone, Copy, PartialEq, Eq`
/// (what [`Named`] needs); further attributes are passed on:
///
/// ```
/// pgstrata_repo::named! {
///     pub enum BackupKind {
///         /// Everything.
///         Full = "full",
///         Incr = "incr",
///     }
/// }
/// use pgstrata_repo::Named;
/// assert_eq!(BackupKind::parse("incr"), Some(BackupKind::Incr));
/// assert_eq!(BackupKind::Full.name(), "full");
/// ```
#[macro_export]
macro_rules! named {
    (
        $(#[$meta:meta])*
        $vis:vis enum $t:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $name:literal ),+ $(,)?
        }
    ) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $(#[$meta])*
        $vis enum $t {
            $( $(#[$vmeta])* $variant ),+
        }
        impl $crate::Named for $t {
            const ALL: &'static [Self] = &[$(Self::$variant),+];
            const NAMES: &'static [&'static str] = &[$($name),+];
        }
    };
}

/// Checks an implementation: as many names as values, all distinct, and every name parses
/// back to its value. Every implementor's tests call it.
#[doc(hidden)]
pub fn check_named<T: Named + std::fmt::Debug>() {
    assert_eq!(T::ALL.len(), T::NAMES.len(), "{:?}", T::ALL);
    for (v, n) in T::ALL.iter().zip(T::NAMES) {
        assert_eq!(v.name(), *n);
        assert_eq!(T::parse(n), Some(*v), "{n}");
    }
    let mut names = T::NAMES.to_vec();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), T::NAMES.len(), "duplicate names");
}
