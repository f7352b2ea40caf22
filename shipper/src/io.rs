//! The one file-I/O seam of the shipper: positional reads of segment files through either
//! io_uring (tokio-uring, the default) or plain `pread` (`std`), chosen at start-up. Where
//! io_uring is unavailable (seccomp, `kernel.io_uring_disabled`, an old kernel) `auto`
//! falls back to `std` and says why.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::str::FromStr;

use tokio_uring::buf::BoundedBuf;

/// The engine that reads WAL segment files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoEngine {
    Uring,
    Std,
}

impl IoEngine {
    pub fn name(self) -> &'static str {
        match self {
            IoEngine::Uring => "uring",
            IoEngine::Std => "std",
        }
    }
}

/// The configured choice (`io-engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoChoice {
    #[default]
    Auto,
    Uring,
    Std,
}

impl FromStr for IoChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(IoChoice::Auto),
            "uring" => Ok(IoChoice::Uring),
            "std" => Ok(IoChoice::Std),
            other => Err(format!(
                "unknown io engine {other:?} (expected auto, uring or std)"
            )),
        }
    }
}

/// Whether an io_uring instance can be created here; the reason when not.
pub fn probe_uring() -> Result<(), String> {
    if let Ok(v) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
        if v.trim() == "2" {
            return Err("kernel.io_uring_disabled = 2".into());
        }
    }
    match tokio_uring::Runtime::new(&tokio_uring::builder()) {
        Ok(rt) => {
            drop(rt);
            Ok(())
        }
        Err(e) => Err(format!("io_uring_setup failed: {e}")),
    }
}

/// Resolves the choice to an engine. `uring` asked for explicitly but unavailable is an
/// error; `auto` falls back to `std` and returns the reason.
pub fn choose(choice: IoChoice) -> Result<(IoEngine, Option<String>), String> {
    match choice {
        IoChoice::Std => Ok((IoEngine::Std, None)),
        IoChoice::Uring => probe_uring()
            .map(|()| (IoEngine::Uring, None))
            .map_err(|e| format!("io-engine = \"uring\" but io_uring is unavailable: {e}")),
        IoChoice::Auto => Ok(match probe_uring() {
            Ok(()) => (IoEngine::Uring, None),
            Err(e) => (IoEngine::Std, Some(e)),
        }),
    }
}

/// An open segment file. `Uring` files only work on the lane thread that opened them.
#[derive(Debug)]
pub enum SegFile {
    Uring(tokio_uring::fs::File),
    Std(std::fs::File),
}

impl SegFile {
    pub async fn open(engine: IoEngine, path: &Path) -> io::Result<SegFile> {
        match engine {
            IoEngine::Uring => Ok(SegFile::Uring(tokio_uring::fs::File::open(path).await?)),
            IoEngine::Std => Ok(SegFile::Std(std::fs::File::open(path)?)),
        }
    }

    /// Reads up to `len` bytes at `off` into `buf` (cleared first); returns the buffer
    /// holding what was read.
    pub async fn read_at(
        &self,
        mut buf: Vec<u8>,
        len: usize,
        off: u64,
    ) -> (io::Result<usize>, Vec<u8>) {
        buf.clear();
        buf.reserve(len);
        match self {
            SegFile::Uring(f) => {
                let mut got = 0usize;
                loop {
                    let (res, slice) = f.read_at(buf.slice(got..len), off + got as u64).await;
                    buf = slice.into_inner();
                    match res {
                        Ok(0) => return (Ok(got), buf),
                        Ok(n) => {
                            got += n;
                            if got >= len {
                                return (Ok(got), buf);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return (Err(e), buf),
                    }
                }
            }
            SegFile::Std(f) => {
                buf.resize(len, 0);
                let mut got = 0usize;
                while got < len {
                    match f.read_at(&mut buf[got..], off + got as u64) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            buf.truncate(got);
                            return (Err(e), buf);
                        }
                    }
                }
                buf.truncate(got);
                (Ok(got), buf)
            }
        }
    }
}
