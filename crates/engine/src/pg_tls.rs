//! TLS for the connection to PostgreSQL over TCP, with libpq's `sslmode` meanings.
//!
//! `prefer` and `require` encrypt without checking who answers (as libpq does without a root
//! certificate): they stop a passive eavesdropper, not an active one. `verify-ca` checks that
//! the server's certificate chains to `pg-sslrootcert`; `verify-full` also checks that it
//! names the host connected to, which is what stops a man in the middle. Unix sockets never
//! use TLS (PostgreSQL does not offer it there).
//!
//! Built on rustls (already in the tree for the object stores) rather than OpenSSL, so the
//! binary needs no system TLS library.
//!
//! A password never crosses TCP in the clear: on a connection the server did not encrypt
//! (it answered the TLS request with 'N'), [`PasswordGuard`] fails the connection when the
//! server asks for a clear-text or MD5 password, before tokio-postgres can answer, unless
//! `pg-sslmode=disable` says plain text is meant. SCRAM-SHA-256 stays allowed: it proves the
//! password without revealing it. tokio-postgres has no switch for this, so the guard sits
//! between it and the socket and reads the server's authentication requests ('R'
//! messages) as they arrive.

use crate::{Error, Result};
use pgstrata_repo::Named;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

// Names as configured (`pg-sslmode`, libpq's values).
pgstrata_repo::named! {
    /// libpq's `sslmode` values pgstrata supports (`pg-sslmode`).
    #[derive(Default)]
    pub enum SslMode {
        Disable = "disable",
        #[default]
        Prefer = "prefer",
        Require = "require",
        VerifyCa = "verify-ca",
        VerifyFull = "verify-full",
    }
}

impl SslMode {
    /// What tokio-postgres is told: whether TLS is tried, and whether it is required.
    pub(crate) fn wire(self, unix_socket: bool) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as W;
        match self {
            _ if unix_socket => W::Disable,
            SslMode::Disable => W::Disable,
            SslMode::Prefer => W::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => W::Require,
        }
    }
}

/// The TLS connector for `mode`. `root_cert` (PEM) is what verify-ca and verify-full trust;
/// without it they use `~/.postgresql/root.crt` as libpq does.
pub(crate) fn connector(mode: SslMode, root_cert: Option<&Path>) -> Result<MakeRustls> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => Arc::new(Lenient {
            provider: provider.clone(),
            chain: None,
        }),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = load_roots(mode, root_cert)?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| Error::config(format!("pg-sslrootcert: {e}")))?;
            if mode == SslMode::VerifyCa {
                Arc::new(Lenient {
                    provider: provider.clone(),
                    chain: Some(webpki),
                })
            } else {
                webpki
            }
        }
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config(format!("TLS setup: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustls(Arc::new(config)))
}

fn load_roots(mode: SslMode, root_cert: Option<&Path>) -> Result<rustls::RootCertStore> {
    let path: PathBuf = match root_cert {
        Some(p) => p.to_path_buf(),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".postgresql/root.crt")
        }
    };
    let pem = std::fs::read(&path).map_err(|e| {
        Error::config(format!(
            "pg-sslmode={} needs the CA certificate that signed the server's: cannot read {} \
             (set pg-sslrootcert): {e}",
            mode.name(),
            path.display()
        ))
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| {
            Error::config(format!("pg-sslrootcert {}: not PEM: {e}", path.display()))
        })?;
        roots.add(cert).map_err(|e| {
            Error::config(format!(
                "pg-sslrootcert {}: unusable certificate: {e}",
                path.display()
            ))
        })?;
    }
    if roots.is_empty() {
        return Err(Error::config(format!(
            "pg-sslrootcert {} holds no certificate",
            path.display()
        )));
    }
    Ok(roots)
}

/// prefer/require and verify-ca: what libpq accepts without a full check. prefer/require
/// (no chain) encrypt without authenticating the server; verify-ca checks that the chain
/// leads to a trusted root but does not compare the certificate's name with the host.
/// Handshake signatures are checked in every mode, with the provider's algorithms (which is
/// what `WebPkiServerVerifier` checks them with too).
#[derive(Debug)]
struct Lenient {
    provider: Arc<CryptoProvider>,
    /// verify-ca's chain check; none for prefer/require.
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }
    fn verify_tls12_signature(&self, msg: &[u8], cert: &Der<'_>, dss: &Dss) -> SignatureCheck {
        rustls::crypto::verify_tls12_signature(msg, cert, dss, &self.signature_algorithms())
    }
    fn verify_tls13_signature(&self, msg: &[u8], cert: &Der<'_>, dss: &Dss) -> SignatureCheck {
        rustls::crypto::verify_tls13_signature(msg, cert, dss, &self.signature_algorithms())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signature_algorithms().supported_schemes()
    }
}

impl Lenient {
    fn signature_algorithms(&self) -> rustls::crypto::WebPkiSupportedAlgorithms {
        self.provider.signature_verification_algorithms
    }
}

// Short names for the signature-check methods' types, so each fits on one line.
type Der<'a> = CertificateDer<'a>;
type Dss = DigitallySignedStruct;
type SignatureCheck = std::result::Result<HandshakeSignatureValid, rustls::Error>;

/// tokio-postgres' TLS hook, on rustls.
#[derive(Clone)]
pub(crate) struct MakeRustls(Arc<rustls::ClientConfig>);

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> MakeTlsConnect<S> for MakeRustls {
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    /// Called for Unix sockets too (with no host name), where TLS is never started: a name
    /// that is no DNS name or address fails only if a handshake is attempted.
    fn make_tls_connect(&mut self, host: &str) -> io::Result<RustlsConnect> {
        Ok(RustlsConnect {
            config: self.0.clone(),
            server_name: ServerName::try_from(host.to_string()).ok(),
        })
    }
}

pub(crate) struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

type ConnectFuture<S> = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> TlsConnect<S> for RustlsConnect {
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = ConnectFuture<S>;

    fn connect(self, stream: S) -> ConnectFuture<S> {
        Box::pin(async move {
            let name = self.server_name.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "pg-host is not a valid TLS server name",
                )
            })?;
            tokio_rustls::TlsConnector::from(self.config)
                .connect(name, stream)
                .await
                .map(RustlsStream)
        })
    }
}

pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    /// No channel binding: SCRAM still authenticates both sides; binding would add
    /// protection only where the certificate is not verified anyway.
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

/// The server's authentication requests that would reveal the password (PostgreSQL's
/// AuthenticationCleartextPassword and AuthenticationMD5Password codes).
const CLEARTEXT_PASSWORD: u32 = 3;
const MD5_PASSWORD: u32 = 5;
const AUTHENTICATION_OK: u32 = 0;

/// What the guard refused, for the caller's error message: the password kind asked for.
#[derive(Clone, Default)]
pub(crate) struct Refusal(Arc<std::sync::Mutex<Option<&'static str>>>);

impl Refusal {
    pub(crate) fn password_kind(&self) -> Option<&'static str> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A TCP stream to PostgreSQL that refuses to let a password request through while the
/// connection is not encrypted (see the module documentation).
pub(crate) struct PasswordGuard<S> {
    inner: S,
    state: GuardState,
    refusal: Refusal,
}

enum GuardState {
    /// The TLS request was sent: the next byte is the server's answer ('S' or not).
    TlsAnswer,
    /// Plain text: reading the server's messages until authentication is over.
    Reading(MessageScan),
    /// TLS, pg-sslmode=disable, or authenticated: nothing more to check.
    Off,
}

/// Position in the server's message stream: type byte, length, and for an 'R' message its
/// code, then the rest of the message to skip.
#[derive(Default)]
struct MessageScan {
    head: [u8; 9],
    have: usize,
    skip: usize,
}

enum Verdict {
    Continue,
    Authenticated,
    Refuse(&'static str),
}

impl MessageScan {
    fn feed(&mut self, data: &[u8]) -> Verdict {
        let mut i = 0;
        while i < data.len() {
            if self.skip > 0 {
                let n = self.skip.min(data.len() - i);
                self.skip -= n;
                i += n;
                continue;
            }
            self.head[self.have] = data[i];
            self.have += 1;
            i += 1;
            let len = || u32::from_be_bytes(self.head[1..5].try_into().unwrap()) as usize;
            if self.have == 5 && (self.head[0] != b'R' || len() < 8) {
                self.skip = len().saturating_sub(4);
                self.have = 0;
            } else if self.have == 9 {
                match u32::from_be_bytes(self.head[5..9].try_into().unwrap()) {
                    CLEARTEXT_PASSWORD => return Verdict::Refuse("cleartext"),
                    MD5_PASSWORD => return Verdict::Refuse("MD5"),
                    AUTHENTICATION_OK => return Verdict::Authenticated,
                    _ => {}
                }
                self.skip = len() - 8;
                self.have = 0;
            }
        }
        Verdict::Continue
    }
}

impl<S> PasswordGuard<S> {
    /// Over TCP with `mode`: tokio-postgres first asks for TLS unless `mode` is disable,
    /// which also lets password requests through.
    pub(crate) fn new(inner: S, mode: SslMode) -> PasswordGuard<S> {
        let state = match mode {
            SslMode::Disable => GuardState::Off,
            _ => GuardState::TlsAnswer,
        };
        PasswordGuard {
            inner,
            state,
            refusal: Refusal::default(),
        }
    }

    pub(crate) fn refusal(&self) -> Refusal {
        self.refusal.clone()
    }

    /// Check bytes just read; an error stops them from reaching tokio-postgres.
    fn check(&mut self, mut data: &[u8]) -> io::Result<()> {
        if let GuardState::TlsAnswer = self.state {
            let Some((&answer, rest)) = data.split_first() else {
                return Ok(());
            };
            if answer == b'S' {
                self.state = GuardState::Off;
                return Ok(());
            }
            self.state = GuardState::Reading(MessageScan::default());
            data = rest;
        }
        let GuardState::Reading(scan) = &mut self.state else {
            return Ok(());
        };
        match scan.feed(data) {
            Verdict::Continue => Ok(()),
            Verdict::Authenticated => {
                self.state = GuardState::Off;
                Ok(())
            }
            Verdict::Refuse(kind) => {
                *self.refusal.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(kind);
                Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("the server asked for a {kind} password without TLS"),
                ))
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PasswordGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if let Err(e) = this.check(&buf.filled()[before..]) {
                    buf.set_filled(before);
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PasswordGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in SslMode::NAMES {
            assert_eq!(SslMode::parse(n).unwrap().name(), *n);
        }
        assert_eq!(SslMode::default(), SslMode::Prefer, "libpq's default");
    }

    #[test]
    fn verify_modes_need_a_readable_root_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.crt");
        let e = connector(SslMode::VerifyFull, Some(&missing))
            .err()
            .expect("refused");
        assert!(e.to_string().contains("nope.crt"), "{e}");
        let empty = dir.path().join("empty.crt");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = connector(SslMode::VerifyCa, Some(&empty))
            .err()
            .expect("refused");
        assert!(e.to_string().contains("no certificate"), "{e}");
        assert!(connector(SslMode::Require, None).is_ok());
    }

    /// The request is found however the reads split the stream: a notice first, then the
    /// password request, one byte per read; and after AuthenticationOk nothing is checked.
    #[test]
    fn password_request_is_seen_across_reads() {
        let notice = [b"N".as_slice(), &9u32.to_be_bytes(), b"Mhi\0\0"].concat();
        let md5 = [
            b"R".as_slice(),
            &12u32.to_be_bytes(),
            &5u32.to_be_bytes(),
            b"salt",
        ]
        .concat();
        let mut guard = PasswordGuard::new((), SslMode::Prefer);
        let stream = [b"N".as_slice(), &notice, &md5].concat();
        let failed = stream
            .iter()
            .position(|b| guard.check(std::slice::from_ref(b)).is_err());
        assert_eq!(
            failed,
            Some(1 + notice.len() + 8),
            "on the code's last byte"
        );
        assert_eq!(guard.refusal().password_kind(), Some("MD5"));

        let ok = [b"R".as_slice(), &8u32.to_be_bytes(), &0u32.to_be_bytes()].concat();
        let mut guard = PasswordGuard::new((), SslMode::Require);
        assert!(guard.check(&[b"N".as_slice(), &ok].concat()).is_ok());
        assert!(guard.check(&md5).is_ok(), "authenticated: no more checks");
        let mut guard = PasswordGuard::new((), SslMode::Prefer);
        assert!(guard.check(b"S").is_ok());
        assert!(guard.check(&md5).is_ok(), "TLS: the request is encrypted");
        let mut guard = PasswordGuard::new((), SslMode::Disable);
        assert!(guard.check(&md5).is_ok(), "disable: allowed knowingly");
    }
}
