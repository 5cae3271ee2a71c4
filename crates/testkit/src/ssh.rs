//! A real sshd on a loopback port, for the two-host tests: its own host key, one client
//! key per OS user, and an ssh client wrapper per user (what `cmd-ssh` names) that trusts
//! exactly this server. Two OS users stand for the two hosts: [`crate::PG_OS_USER`]
//! (the database host) and [`BACKUP_OS_USER`] (the backup host); neither can read the
//! other's files, so only the SSH paths can work.
//!
//! sshd must start as root (it switches to the user that logs in), so these tests need
//! root; .ci/setup installs openssh-server and creates the backup user.

use crate::{
    chown_to, free_port, fs, is_root, run_ok, set_mode, Error, ErrorKind, Result, PG_OS_USER,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The OS user standing for the backup host.
pub const BACKUP_OS_USER: &str = "pgstrata-backup";

pub struct SshServer {
    pub port: u16,
    dir: PathBuf,
    sshd: Child,
}

/// Write `user`'s ssh client configuration and wrapper (`ssh_config{suffix}`,
/// `ssh{suffix}`) in `home`, reaching 127.0.0.1:`port`; returns the wrapper.
fn write_client(
    home: &Path,
    user: &str,
    port: u16,
    known_hosts: &Path,
    suffix: &str,
) -> Result<PathBuf> {
    let key = home.join("id_ed25519");
    let config = home.join(format!("ssh_config{suffix}"));
    fs::write(
        &config,
        format!(
            "Host *\n  HostName 127.0.0.1\n  Port {port}\n  IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n",
            key.display(),
            known_hosts.display()
        ),
    )?;
    let wrapper = home.join(format!("ssh{suffix}"));
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec /usr/bin/ssh -F {} \"$@\"\n",
            config.display()
        ),
    )?;
    for p in [&config, &wrapper] {
        chown_to(p, user)?;
    }
    set_mode(&config, 0o600)?;
    set_mode(&wrapper, 0o700)?;
    Ok(wrapper)
}

impl SshServer {
    /// Start sshd in `dir` (a fresh directory, given to root) for [`PG_OS_USER`] and
    /// [`BACKUP_OS_USER`].
    pub fn start(dir: &Path) -> Result<SshServer> {
        if !is_root() {
            return Err(Error::new(
                ErrorKind::NotInstalled,
                "the SSH tests start sshd, which needs root (run them as root, as CI does)",
            ));
        }
        let sshd = Path::new("/usr/sbin/sshd");
        if !sshd.exists() {
            return Err(Error::new(
                ErrorKind::NotInstalled,
                "/usr/sbin/sshd not found: apt-get install openssh-server (.ci/setup does)",
            ));
        }
        fs::create_dir_all(dir)?;
        set_mode(dir, 0o755)?;
        // sshd's privilege separation directory.
        fs::create_dir_all("/run/sshd")?;
        set_mode(Path::new("/run/sshd"), 0o755)?;
        let host_key = dir.join("host_key");
        run_ok(
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(&host_key),
        )?;
        let auth_dir = dir.join("authorized_keys");
        fs::create_dir_all(&auth_dir)?;
        set_mode(&auth_dir, 0o755)?;
        let port = free_port();
        let host_pub = fs::read_to_string(dir.join("host_key.pub"))?;
        let known_hosts = dir.join("known_hosts");
        fs::write(&known_hosts, format!("[127.0.0.1]:{port} {host_pub}"))?;
        set_mode(&known_hosts, 0o644)?;
        for user in [PG_OS_USER, BACKUP_OS_USER] {
            let home = dir.join(format!("client-{user}"));
            fs::create_dir_all(&home)?;
            let key = home.join("id_ed25519");
            run_ok(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-C", user, "-f"])
                    .arg(&key),
            )?;
            // Each host logs in to the other: this user's key lets it in as the other one.
            let public = fs::read_to_string(home.join("id_ed25519.pub"))?;
            let other = if user == PG_OS_USER {
                BACKUP_OS_USER
            } else {
                PG_OS_USER
            };
            let authorized = auth_dir.join(other);
            fs::write(&authorized, public)?;
            set_mode(&authorized, 0o644)?;
            for p in [&home, &key] {
                chown_to(p, user)?;
            }
            set_mode(&home, 0o700)?;
            set_mode(&key, 0o600)?;
            write_client(&home, user, port, &known_hosts, "")?;
        }
        let config = dir.join("sshd_config");
        fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile {}\nAuthorizedKeysFile {}/%u\n\
                 StrictModes no\nUsePAM yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PubkeyAuthentication yes\nPermitRootLogin no\nAllowUsers {PG_OS_USER} {BACKUP_OS_USER}\n\
                 PrintMotd no\nPrintLastLog no\nLogLevel ERROR\nMaxStartups 100\nMaxSessions 100\n",
                host_key.display(),
                dir.join("sshd.pid").display(),
                auth_dir.display()
            ),
        )?;
        let child = Command::new(sshd)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(fs::create(dir.join("sshd.log"))?))
            .spawn()
            .map_err(|e| Error::io("start sshd", e))?;
        let server = SshServer {
            port,
            dir: dir.to_path_buf(),
            sshd: child,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("sshd did not listen within 20 s: {}", server.log()),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// The ssh client wrapper for `user` (give it as `cmd-ssh`): it reaches this server
    /// whatever host name it is given, with `user`'s key, trusting only this host key.
    pub fn client(&self, user: &str) -> PathBuf {
        self.dir.join(format!("client-{user}")).join("ssh")
    }

    /// Another ssh client wrapper for `user` that connects to 127.0.0.1:`port` instead of
    /// this server's own port: a relay in front of the server (a throttled link, say) that
    /// forwards to it. It trusts this server's host key at that port, and only it.
    pub fn client_via(&self, user: &str, port: u16) -> Result<PathBuf> {
        let home = self.dir.join(format!("client-{user}"));
        if !home.is_dir() {
            return Err(Error::new(
                ErrorKind::NotInstalled,
                format!("no ssh client for {user} in {}", self.dir.display()),
            ));
        }
        let host_pub = fs::read_to_string(self.dir.join("host_key.pub"))?;
        let known_hosts = self.dir.join(format!("known_hosts-via-{port}"));
        fs::write(&known_hosts, format!("[127.0.0.1]:{port} {host_pub}"))?;
        set_mode(&known_hosts, 0o644)?;
        write_client(&home, user, port, &known_hosts, &format!("-via-{port}"))
    }

    /// Limit what logging in as `user` may do to `command`, as the README's
    /// `authorized_keys` does: `restrict,command="..."` before the key. Whatever command
    /// the client asks for, sshd runs `command` (the client's words are in
    /// `SSH_ORIGINAL_COMMAND`, which pgstrata ignores).
    pub fn force_command(&self, user: &str, command: &str) -> Result<()> {
        let p = self.dir.join("authorized_keys").join(user);
        let key = fs::read_to_string(&p)?;
        let key = key
            .rsplit_once('"')
            .map_or(key.as_str(), |(_, k)| k.trim_start());
        let line = format!(
            "restrict,command=\"{}\" {key}",
            command.replace('\\', "\\\\").replace('"', "\\\"")
        );
        fs::write(&p, line)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }

    /// Kill every connection's sshd process (the listener stays): each SSH session
    /// through this server drops as a broken link would drop it.
    pub fn drop_connections(&self) {
        // Each connection is a [priv] child of the listener and its unprivileged child,
        // which holds the socket too: kill every descendant.
        let listener = self.sshd.id() as i32;
        let mut parents = std::collections::HashMap::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // Field 4, after the parenthesised command name.
            if let Some(ppid) = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok())
            {
                parents.insert(pid, ppid);
            }
        }
        let descends = |mut pid: i32| {
            while let Some(&p) = parents.get(&pid) {
                if p == listener {
                    return true;
                }
                if p <= 1 {
                    return false;
                }
                pid = p;
            }
            false
        };
        for &pid in parents.keys().filter(|&&p| p != listener && descends(p)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        self.drop_connections();
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
        // Its keys, configuration and whatever the test kept there (a backup host's
        // repository): 30 MB a test, left in the temporary directory by every run
        // before. Kept like a test's scratch directory when asked to.
        if std::env::var_os("PGSTRATA_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
