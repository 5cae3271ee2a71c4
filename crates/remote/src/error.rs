//! Errors of the remote layer: reaching the other host, speaking the agent protocol with
//! it, serving a repository to it.
//!
//! As in the other crates: a kind to branch on, a context naming what failed, the source
//! kept; shown as the repository's errors are (context, then the source's message: both
//! through [`cause_suffix`], the type declared by [`kinded_error!`]). What
//! crosses into `object_store` (the [`crate::RemoteStore`] side) goes as that crate's
//! errors, which `pgstrata_repo` already sorts into its kinds; this type is for the rest:
//! starting ssh, the hellos, an agent's serving loop, rebuilding a patched object.

/// The failure underneath an error, kept so `source()` walks down to it.
pub type Source = Box<dyn std::error::Error + Send + Sync>;

/// What follows an error's own words: `": "` and its source's message, when it has one.
/// Written once for the layers' errors (this crate's, the repository's, the engine's).
pub fn cause_suffix(source: &Option<Source>) -> String {
    source
        .as_ref()
        .map(|s| format!(": {s}"))
        .unwrap_or_default()
}

/// A layer's error type, the same shape in every layer: a struct of `kind` (`$kind`, whose
/// `is_retryable` decides the error's), `context` naming what failed, and the `source`
/// underneath; shown as its context then [`cause_suffix`]; made with `new` and
/// `with_source` (visibility given). Each crate declares its own with it: this crate is the
/// lowest one with such an error, the repository's uses it too.
#[macro_export]
macro_rules! kinded_error {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident($kind:ty);
        $with_source_vis:vis fn with_source;
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        $vis struct $name {
            pub kind: $kind,
            pub context: String,
            pub source: Option<$crate::error::Source>,
        }

        impl $name {
            pub fn new(kind: $kind, context: impl Into<String>) -> Self {
                Self {
                    kind,
                    context: context.into(),
                    source: None,
                }
            }

            $with_source_vis fn with_source(
                kind: $kind,
                context: impl Into<String>,
                source: impl Into<$crate::error::Source>,
            ) -> Self {
                Self {
                    kind,
                    context: context.into(),
                    source: Some(source.into()),
                }
            }

            /// True when trying again may succeed (see the kind's `is_retryable`).
            pub fn is_retryable(&self) -> bool {
                self.kind.is_retryable()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.context)?;
                f.write_str(&$crate::error::cause_suffix(&self.source))
            }
        }

        impl std::error::Error for $name {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.source.as_deref().map(|s| s as _)
            }
        }
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The peer could not be reached or the connection to it broke (ssh failed, the
    /// stream closed or failed): a new connection may succeed.
    Link,
    /// The peer answered and is not one this pgstrata can speak to (not an agent, another
    /// protocol version), or sent what the protocol does not allow: permanent until the
    /// hosts are set up alike.
    Protocol,
    /// A file operation on this host failed (the served repository's directory, starting
    /// the ssh client).
    Io,
    /// An object cannot be made from a patch here (not a manifest, a damaged base or
    /// patch, no key to open the base): the requester sends the object whole.
    Rebuild,
    /// An object or frame cannot be opened with the master key and sealed again for a
    /// peer holding a session key: it is damaged or not the object stored under its name.
    Reseal,
}

impl ErrorKind {
    /// True when trying again may succeed without anything being changed: only a link
    /// that failed.
    pub fn is_retryable(self) -> bool {
        self == ErrorKind::Link
    }
}

kinded_error! {
    pub struct Error(ErrorKind);
    pub fn with_source;
}

pub type Result<T> = std::result::Result<T, Error>;
