//! Reading the repository's files without trusting them: only regular files
//! are opened (a FIFO, `/dev/zero` or a socket, also behind a symlink, is
//! refused before it is opened, and again on the opened descriptor), and
//! never more is read than a bound. Every function here blocks: the
//! repository calls them from `spawn_blocking`, never on an async worker.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::path::Path;

/// The most a `model-settings.json` may hold.
pub const MAX_SETTINGS_BYTES: u64 = 1 << 20;

/// What kind of file `m` describes, for messages ("a FIFO").
fn kind(m: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a plain file"
    }
}

fn not_regular(m: &Metadata) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file ({}); refused", kind(m)),
    )
}

/// Opens `path` (symlinks followed) for reading, if it is a regular file.
/// Checked before opening; opened non-blocking (a FIFO swapped in after the
/// check cannot block the open) and checked again on the descriptor.
/// Returns the file and its metadata (of what was opened).
pub fn open_regular(path: &Path) -> io::Result<(File, Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let m = std::fs::metadata(path)?;
    if !m.file_type().is_file() {
        return Err(not_regular(&m));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(not_regular(&m));
    }
    Ok((f, m))
}

/// Reads the settings file at `path` as UTF-8, at most
/// [`MAX_SETTINGS_BYTES`]. A missing file is `NotFound` (the caller tells
/// "no settings" from "unreadable settings" by it).
pub fn read_settings(path: &Path) -> io::Result<String> {
    let (f, _) = open_regular(path)?;
    let mut bytes = Vec::new();
    f.take(MAX_SETTINGS_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SETTINGS_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {} KiB; refused", MAX_SETTINGS_BYTES / 1024),
        ));
    }
    String::from_utf8(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// The file's metadata and a 64-bit digest of its bytes (change detection,
/// not security), for a regular file only. Reads at most the length the
/// opened file had, stopping early at end of file.
pub fn digest(path: &Path) -> io::Result<(Metadata, u64)> {
    use std::hash::Hasher;
    let (f, m) = open_regular(path)?;
    let mut f = f.take(m.len());
    let mut h = std::hash::DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => return Ok((m, h.finish())),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.write(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes a FIFO at `path` (nothing ever writes to it).
    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(
            unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
            0,
            "mkfifo {}",
            path.display()
        );
    }

    #[test]
    fn only_regular_files_are_read_and_never_past_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        mkfifo(&d.join("fifo"));
        std::os::unix::fs::symlink(d.join("fifo"), d.join("to-fifo")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.join("zero")).unwrap();
        std::fs::create_dir(d.join("folder")).unwrap();
        for (name, what) in [
            ("fifo", "a FIFO"),
            ("to-fifo", "a FIFO"),
            ("zero", "a character device"),
            ("folder", "a folder"),
        ] {
            let e = digest(&d.join(name)).unwrap_err().to_string();
            assert!(
                e.contains("not a regular file") && e.contains(what),
                "{name}: {e}"
            );
            let e = read_settings(&d.join(name)).unwrap_err().to_string();
            assert!(e.contains(what), "{name}: {e}");
        }
        assert_eq!(
            read_settings(&d.join("missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        std::fs::write(d.join("big.json"), vec![b' '; MAX_SETTINGS_BYTES as usize + 1]).unwrap();
        let e = read_settings(&d.join("big.json")).unwrap_err().to_string();
        assert!(e.contains("larger than 1024 KiB"), "{e}");
        std::fs::write(d.join("ok.json"), "{}").unwrap();
        assert_eq!(read_settings(&d.join("ok.json")).unwrap(), "{}");
        let (m, a) = digest(&d.join("ok.json")).unwrap();
        assert_eq!((m.len(), a), (2, digest(&d.join("ok.json")).unwrap().1));
    }
}
