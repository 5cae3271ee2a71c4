//! Test fixtures: everything of `pgstrata-cluster` (throwaway PostgreSQL clusters), plus
//! real storage servers on loopback ports for the object-store tests: moto (S3) and
//! Azurite (Azure blob) with pgstrata's settings for them, an sshd for the two-host tests,
//! and the one network [`Proxy`] (rate limit, delays, byte counts, HTTP faults) to put in
//! front of any of them. Used by the tests and benchmarks only, never by the binary (the
//! demo and restore-test use `pgstrata-cluster` alone).

pub mod proxy;
mod ssh;

pub use pgstrata_cluster::*;
use pgstrata_repo::storage::{AzureConfig, RepoConfig, RepoKind, S3Config};
pub use proxy::Proxy;
pub use ssh::{SshServer, BACKUP_OS_USER};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A real S3 server (moto's server mode, from `pip install 'moto[server]'`) on a loopback
/// port, with one bucket. Stopped on drop.
pub struct S3Server {
    pub port: u16,
    pub bucket: String,
    _process: ServerProcess,
}

impl S3Server {
    pub fn start(bucket: &str) -> Result<S3Server> {
        let port = free_port();
        let exe = which("moto_server").ok_or_else(|| {
            Error::new(
                ErrorKind::NotInstalled,
                "moto_server not found: pip install 'moto[server]' (.ci/setup does) or put it on PATH",
            )
        })?;
        let mut command = Command::new(exe);
        command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let server = S3Server {
            port,
            bucket: bucket.to_string(),
            _process: ServerProcess::spawn(command, "moto_server")?,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if http_request(port, "PUT", &format!("/{bucket}")).is_ok_and(|status| status == 200) {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    "moto_server did not come up within 30 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Make another bucket on this server; with `lock` (`("COMPLIANCE" or "GOVERNANCE",
    /// days)`), with Object Lock on and that default retention, as an administrator would
    /// set up an immutable repository's bucket.
    pub fn create_bucket(&self, bucket: &str, lock: Option<(&str, u32)>) -> Result<()> {
        let failed = |what: &str, status: std::io::Result<u16>| {
            Error::new(
                ErrorKind::Failed,
                format!("moto: {what} of bucket {bucket}: {status:?}"),
            )
        };
        let header = match lock {
            Some(_) => "x-amz-bucket-object-lock-enabled: true\r\n",
            None => "",
        };
        let status = http_request_with(self.port, "PUT", &format!("/{bucket}"), header, "");
        if !matches!(status, Ok(200)) {
            return Err(failed("creation", status));
        }
        if let Some((mode, days)) = lock {
            let body = format!(
                "<ObjectLockConfiguration><ObjectLockEnabled>Enabled</ObjectLockEnabled><Rule>\
                 <DefaultRetention><Mode>{mode}</Mode><Days>{days}</Days></DefaultRetention>\
                 </Rule></ObjectLockConfiguration>"
            );
            let status = http_request_with(
                self.port,
                "PUT",
                &format!("/{bucket}?object-lock"),
                "",
                &body,
            );
            if !matches!(status, Ok(200)) {
                return Err(failed("the Object Lock configuration", status));
            }
        }
        Ok(())
    }

    /// pgstrata's settings for a repository at `path` in this server's bucket (moto takes
    /// any key; path-style addressing, as a bucket name is no host name here). Point
    /// `s3.endpoint` elsewhere to go through a [`Proxy`].
    pub fn repo_config(&self, path: &str) -> RepoConfig {
        RepoConfig {
            kind: RepoKind::S3,
            path: path.to_string(),
            s3: S3Config {
                bucket: self.bucket.clone(),
                endpoint: Some(self.endpoint()),
                region: Some("us-east-1".into()),
                key: Some("test".into()),
                key_secret: Some("test".into()),
                path_style: true,
                ..Default::default()
            },
            verify_tls: true,
            timeout: Duration::from_secs(30),
            retries: 2,
            ..Default::default()
        }
    }
}

/// A storage server's process, output discarded; killed and reaped on drop.
struct ServerProcess(std::process::Child);

impl ServerProcess {
    fn spawn(mut command: Command, what: &str) -> Result<ServerProcess> {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error::io(format!("cannot start {what}"), e))?;
        Ok(ServerProcess(child))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/local/bin".into(), "/root/.local/bin".into()])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// A minimal HTTP/1.1 request (moto accepts unsigned bucket creation); returns the status.
fn http_request(port: u16, method: &str, path: &str) -> std::io::Result<u16> {
    http_request_with(port, method, path, "", "")
}

/// [`http_request`] with more `headers` (each ending in CRLF) and a `body`.
fn http_request_with(
    port: u16,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf)?;
    let text = String::from_utf8_lossy(&buf[..n]);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad HTTP answer: {text}")))
}

/// Azurite's blob service (npm package `azurite`; `.ci/setup` installs it) on a loopback
/// port, with one container, using Azurite's well-known development account.
pub struct AzuriteServer {
    pub port: u16,
    pub container: String,
    _process: ServerProcess,
    _data: Scratch,
}

/// Azurite's documented development account and key.
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

impl AzuriteServer {
    pub fn start(container: &str) -> Result<AzuriteServer> {
        let exe = tool("azurite-blob")?;
        let port = free_port();
        let data = Scratch::new("azurite-data");
        let mut command = Command::new(exe);
        command
            .args([
                "--blobHost",
                "127.0.0.1",
                "--skipApiVersionCheck",
                "--loose",
                "-s",
            ])
            .arg("--blobPort")
            .arg(port.to_string())
            .arg("--location")
            .arg(&data.path);
        let server = AzuriteServer {
            port,
            container: container.to_string(),
            _process: ServerProcess::spawn(command, "azurite-blob")?,
            _data: data,
        };
        wait_for_port(port, "azurite")?;
        // Creating a container needs a signed request: the Azure SDK for Python does it.
        let cs = format!(
            "DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};BlobEndpoint={}/{AZURITE_ACCOUNT};",
            server.endpoint()
        );
        run_ok(Command::new("python3").arg("-c").arg(format!(
            "from azure.storage.blob import BlobServiceClient; BlobServiceClient.from_connection_string('{cs}').create_container('{container}')"
        )))
        .map_err(|e| {
            Error::new(
                e.kind,
                format!("create Azurite container (pip install azure-storage-blob): {e}"),
            )
        })?;
        Ok(server)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// pgstrata's settings for a repository at `path` in this server's container.
    pub fn repo_config(&self, path: &str) -> RepoConfig {
        RepoConfig {
            kind: RepoKind::Azure,
            path: path.to_string(),
            azure: AzureConfig {
                account: AZURITE_ACCOUNT.into(),
                container: self.container.clone(),
                key: Some(AZURITE_KEY.into()),
                endpoint: Some(format!("{}/{AZURITE_ACCOUNT}", self.endpoint())),
            },
            verify_tls: true,
            timeout: Duration::from_secs(30),
            retries: 2,
            ..Default::default()
        }
    }
}

/// A test server program: on PATH, or where .ci/setup installs tools.
fn tool(name: &str) -> Result<PathBuf> {
    which(name)
        .or_else(|| {
            [format!(
                "/opt/pgstrata-tools/azurite/node_modules/.bin/{name}"
            )]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
        })
        .ok_or_else(|| {
            Error::new(
                ErrorKind::NotInstalled,
                format!("{name} not found: run .ci/setup"),
            )
        })
}

fn wait_for_port(port: u16, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("{what} did not listen on port {port} within 30 s"),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
