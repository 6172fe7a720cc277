//! Opening the files a user names: regular files only, refused without blocking when the path
//! is a FIFO, a device, a socket or a directory (opening a FIFO for reading waits for a writer,
//! forever when none comes).

use std::fs::File;
use std::io::{Error, ErrorKind, Read, Result};
use std::path::Path;

/// `O_NONBLOCK` on Linux (the same value on x86-64 and aarch64): opening a FIFO returns at once
/// instead of waiting for a writer. It changes nothing for a regular file.
#[cfg(target_os = "linux")]
const O_NONBLOCK: i32 = 0o4000;

/// Open `path` for reading with `extra_flags` (e.g. `O_DIRECT`) if it is a regular file (after
/// following symbolic links); an [`ErrorKind::InvalidInput`] error naming what it is otherwise.
pub fn open_regular_with(path: &Path, extra_flags: i32) -> Result<File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(O_NONBLOCK | extra_flags);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = extra_flags;
    let f = opts.open(path)?;
    let kind = f.metadata()?.file_type();
    if kind.is_file() {
        return Ok(f);
    }
    Err(Error::new(
        ErrorKind::InvalidInput,
        format!("not a regular file ({})", describe(&kind)),
    ))
}

/// [`open_regular_with`] without extra flags.
pub fn open_regular(path: &Path) -> Result<File> {
    open_regular_with(path, 0)
}

/// The whole of the regular file at `path` (see [`open_regular`]).
pub fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let mut f = open_regular(path)?;
    let mut bytes = Vec::with_capacity(f.metadata().map_or(0, |m| m.len() as usize));
    f.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Whether `path` may be written as a regular file: Ok when nothing is there or a regular file
/// is (after following symbolic links); an [`ErrorKind::InvalidInput`] error when something
/// else is (opening a FIFO for writing waits for a reader; a device or directory is never
/// meant), checked before creating or replacing the file.
pub fn check_writable_path(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(Error::new(
            ErrorKind::InvalidInput,
            format!("not a regular file ({})", describe(&meta.file_type())),
        )),
        _ => Ok(()),
    }
}

/// What a file that is not a regular one is, in words.
fn describe(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_block_device() || kind.is_char_device() {
            return "a device";
        }
    }
    if kind.is_dir() {
        return "a directory";
    }
    "not a file"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_open_and_others_are_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("pi-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"abc").unwrap();
        assert_eq!(read_regular(&file).unwrap(), b"abc");
        let err = open_regular(&dir).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
        assert!(check_writable_path(&dir).is_err());
        assert!(check_writable_path(&file).is_ok());
        assert!(check_writable_path(&dir.join("absent")).is_ok());
        #[cfg(target_os = "linux")]
        {
            // A FIFO with no writer: a plain open would wait forever.
            let fifo = dir.join("fifo");
            let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            extern "C" {
                fn mkfifo(path: *const std::ffi::c_char, mode: u32) -> i32;
            }
            // SAFETY: `c` is a NUL-terminated path that outlives the call.
            assert_eq!(unsafe { mkfifo(c.as_ptr(), 0o600) }, 0);
            let err = open_regular(&fifo).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            assert!(err.to_string().contains("FIFO"), "{err}");
            assert!(check_writable_path(&fifo).is_err());
            assert!(open_regular(Path::new("/dev/null")).is_err());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
