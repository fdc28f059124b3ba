//! Unix stream sockets, for listeners (`[[listeners]] address =
//! "unix:/run/lb.sock"`, HAProxy's `bind /run/lb.sock mode 660`) and for
//! backends (`address = "unix:/run/app.sock"`, HAProxy's `server s1
//! /run/app.sock` or `unix@/run/app.sock`).
//!
//! The data paths move bytes with `recv`, `send`/`sendmsg`, `shutdown` and
//! epoll readiness, which a Unix stream socket answers exactly as a TCP one
//! does; so a connected Unix socket is carried in the same stream type as a
//! TCP connection (`tokio::net::TcpStream`, a descriptor and its reactor
//! registration) and the fast path stays one code path. The TCP-only calls
//! made on backend streams (`TCP_NODELAY`) fail harmlessly and are ignored;
//! nothing asks such a stream for an IP address.

use std::io;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::path::{Path, PathBuf};

use tokio::net::TcpStream;

/// A listener's Unix socket: its path and the permissions to give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnixListen {
    pub path: PathBuf,
    /// `chmod` bits (None: as the umask leaves them).
    pub mode: Option<u32>,
}

/// Bind a listener's socket. A socket file left by a process that is gone
/// is replaced; one that a live process accepts on is "address already in
/// use" (as a busy port is); a path that is not a socket is left alone.
/// The listener is carried as the TCP listener type (see the module's note).
pub fn bind(u: &UnixListen) -> io::Result<std::net::TcpListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(&u.path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "the path exists and is not a socket"));
        }
        match std::os::unix::net::UnixStream::connect(&u.path) {
            Ok(_) => return Err(io::Error::from_raw_os_error(libc::EADDRINUSE)),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(&u.path)?,
            Err(e) => return Err(e),
        }
    }
    let sock = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    sock.set_nonblocking(true)?;
    sock.bind(&socket2::SockAddr::unix(&u.path)?)?;
    if let Some(mode) = u.mode {
        std::fs::set_permissions(&u.path, std::fs::Permissions::from_mode(mode))?;
    }
    sock.listen(4096)?;
    // SAFETY: an open, listening, non-blocking stream socket whose ownership moves.
    Ok(unsafe { std::net::TcpListener::from_raw_fd(sock.into_raw_fd()) })
}

/// `unix:/path` or `unix@/path` (HAProxy), or an absolute path: the socket's path.
pub fn backend_path(name: &str) -> Option<PathBuf> {
    let p = name
        .strip_prefix("unix:")
        .or_else(|| name.strip_prefix("unix@"))
        .or_else(|| name.starts_with('/').then_some(name))?;
    Some(PathBuf::from(p))
}

/// Check a Unix backend address: an absolute path that fits in `sun_path`.
pub fn check_path(name: &str, path: &Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err(format!("backend address {name:?}: a unix socket path must be absolute"));
    }
    // sun_path holds 108 bytes with the terminating NUL
    if path.as_os_str().len() > 107 {
        return Err(format!("backend address {name:?}: a unix socket path is at most 107 bytes"));
    }
    Ok(())
}

/// Connect to the socket at `path`, as the stream type of the data paths.
pub async fn connect(path: &Path) -> io::Result<TcpStream> {
    let s = tokio::net::UnixStream::connect(path).await?.into_std()?;
    // SAFETY: an open, connected, non-blocking stream socket whose ownership
    // moves to the new value (see the module's note on the stream type).
    let s = unsafe { std::net::TcpStream::from_raw_fd(s.into_raw_fd()) };
    TcpStream::from_std(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn paths() {
        assert_eq!(backend_path("unix:/run/a.sock"), Some(PathBuf::from("/run/a.sock")));
        assert_eq!(backend_path("unix@/run/a.sock"), Some(PathBuf::from("/run/a.sock")));
        assert_eq!(backend_path("/run/a.sock"), Some(PathBuf::from("/run/a.sock")));
        assert_eq!(backend_path("127.0.0.1:80"), None);
        assert!(check_path("unix:a", Path::new("a")).is_err());
        assert!(check_path("x", &PathBuf::from(format!("/{}", "a".repeat(120)))).is_err());
    }

    #[tokio::test]
    async fn a_unix_stream_carries_bytes_both_ways() {
        let dir = std::env::temp_dir().join(format!("rustext-unix-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await.unwrap();
            s.write_all(&b).await.unwrap();
        });
        let mut c = connect(&path).await.unwrap();
        assert!(c.set_nodelay(true).is_err()); // TCP-only: refused, harmless
        c.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");
        server.await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
