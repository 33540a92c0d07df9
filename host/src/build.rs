//! PTX build helper for a kernel crate's consumer `build.rs` (our answer to
//! Rust-CUDA's `cuda_builder`).
//!
//! ```no_run
//! // in `fn main` of build.rs of the crate that launches the kernels:
//! doorbell::build::PtxBuilder::new("../my-kernels").build_or_report();
//! // then, in that crate:
//! // const KERNELS: doorbell::ModuleImage = doorbell::module_image!("my_kernels");
//! // (or the PTX alone: include_str!(concat!(env!("OUT_DIR"), "/my_kernels.ptx")))
//! ```
//!
//! It runs a nested `cargo rustc` for `nvptx64-nvidia-cuda` with
//! `-Zbuild-std=core`, fat LTO and `--emit=asm` (a no-op linker: the LTO'd
//! module's assembly *is* the PTX), in its own target directory, so rebuilds
//! after a kernel edit are incremental. Rust-CUDA's `rustc_codegen_nvvm`
//! cannot be used (it needs LLVM 7); this uses rustc's own NVPTX backend.
//!
//! The device compiler is Debian's `rustc-web` (1.96, LLVM 22) with
//! `rust-web-src` providing core's source. Environment:
//!
//! | variable | meaning |
//! |---|---|
//! | `DOORBELL_DEVICE_CARGO`, `DOORBELL_DEVICE_RUSTC` | device toolchain (default `/usr/bin/cargo`, `/usr/bin/rustc`) |
//! | `DOORBELL_PTX_ARCH` | `sm_90` by default |
//! | `DOORBELL_PTX_TARGET_DIR` | nested target directory (default `<target>/doorbell-ptx`) |
//! | `DOORBELL_SKIP_PTX=1` | write a placeholder instead (GPU launches then fail with a clear error) |
//! | `DOORBELL_PTXAS` | the `ptxas` that turns the PTX into a cubin for the arch (default: `ptxas` on `PATH`, then `$CUDA_HOME/bin`, `/usr/local/cuda/bin`, then the `nvidia-cuda-nvcc` wheel's that `scripts/setup.sh` installs); `0` for none |
//!
//! ## Cubins
//! Next to `<crate>.ptx` the build writes `<crate>.cubin`: the PTX
//! assembled by `ptxas` for the arch when one is found, else an empty file
//! (so `include_bytes!` always works). A module with a cubin
//! ([`crate::ModuleImage`]) loads without the driver compiling its PTX — on
//! an H200 that compile took 56 s for the examples' 2.9 MB of PTX on a
//! fresh machine; the driver's cache serves later runs. The cubin is
//! rebuilt only when the PTX (or the arch) changed.
//!
//! The build never degrades silently: whenever it writes no cubin it says
//! why in a `cargo:warning` (no `ptxas` found — and where it looked —,
//! `DOORBELL_PTXAS=0`, a `ptxas` that failed), and a cubin assembled
//! earlier from the very same PTX and arch is kept when no `ptxas` is found
//! any more (a shell without `DOORBELL_PTXAS`, say), never replaced by an
//! empty one.
//!
//! ## Traced images
//! With `DOORBELL_TRACE_KERNELS=1` ([`TRACE_KERNELS_ENV`]) each crate is
//! built a second time with the device trace's hooks, into
//! `<crate>.traced.ptx` and `<crate>.traced.cubin` (in a target directory
//! of its own); without it those two files are empty. A module loads its
//! traced image only when tracing is requested for the process (see
//! [`crate::ModuleImage`]).
//!
//! ## Errors
//! [`PtxBuilder::build_or_report`] is the call for a build script: a kernel
//! that does not compile is reported as the compiler's own errors (the
//! kernel crate's, without the library's warnings, the nested cargo's
//! progress lines or a panic's backtrace), one `cargo::error` line each.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why the PTX build failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// No device toolchain (or no core source for `-Zbuild-std`).
    Toolchain(String),
    /// The kernel crate's manifest could not be read.
    Manifest(PathBuf, std::io::Error),
    /// The nested cargo failed; `stderr` holds its output.
    Cargo {
        /// How the nested cargo exited.
        status: String,
        /// Its standard error.
        stderr: String,
    },
    /// The build finished but produced no PTX where expected.
    MissingOutput(PathBuf),
    /// Filesystem error.
    Io(PathBuf, std::io::Error),
    /// Not run from a build script (no `OUT_DIR`).
    NoOutDir,
    /// The `ptxas` that `DOORBELL_PTXAS` names could not assemble the PTX.
    Ptxas(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Toolchain(m) => write!(f, "device toolchain not usable: {m}. Install it with scripts/setup.sh (Debian: apt-get install rustc-web cargo-web rust-web-src), or set DOORBELL_SKIP_PTX=1 to build for the CPU emulator only"),
            BuildError::Manifest(p, e) => write!(f, "cannot read kernel crate manifest {}: {e}", p.display()),
            BuildError::Cargo { status, stderr } => write!(f, "nested PTX build failed ({status}):\n{stderr}"),
            BuildError::MissingOutput(p) => write!(f, "PTX build produced no {}", p.display()),
            BuildError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            BuildError::NoOutDir => write!(f, "OUT_DIR is not set: call PtxBuilder from a build script, or set an output path"),
            BuildError::Ptxas(m) => write!(f, "{m}; DOORBELL_PTXAS names the ptxas that makes the cubins (unset it to search PATH and CUDA_HOME, or set it to 0 for no cubin)"),
        }
    }
}

impl std::error::Error for BuildError {}

impl BuildError {
    /// The error as lines for a build script's `cargo::error` (`krate`: the
    /// kernel crate's directory): a compile failure as its error
    /// diagnostics only, anything else as its message.
    pub fn report_lines(&self, krate: &str) -> Vec<String> {
        match self {
            BuildError::Cargo { status, stderr } => {
                let diags = error_diagnostics(stderr);
                let mut lines = vec![format!("the kernel crate {krate} did not compile for the GPU ({status}):")];
                if diags.is_empty() {
                    // Nothing shaped like a diagnostic: the whole output.
                    lines.extend(stderr.lines().map(str::to_string));
                } else {
                    lines.extend(diags.into_iter().map(str::to_string));
                }
                lines
            }
            other => vec![format!("PTX build of {krate}: {other}")],
        }
    }
}

/// `DOORBELL_TRACE_KERNELS=1` at build time: every kernel crate the helper
/// builds is built twice, as always and with the device trace's hooks
/// (`doorbell-kernels`' `trace` feature; see `doorbell::trace`), and
/// [`crate::ModuleImage`] embeds both; a load takes the traced image only
/// when tracing is requested for the process, so with tracing off the GPU
/// runs the code of a build without the variable. A build that asks for a
/// `trace` feature itself is traced already and gets no second image.
/// Without the variable the hooks are in no image at all.
pub const TRACE_KERNELS_ENV: &str = "DOORBELL_TRACE_KERNELS";

/// Builds one kernel crate into one PTX file.
#[derive(Clone, Debug)]
pub struct PtxBuilder {
    crate_dir: PathBuf,
    arch: String,
    features: Vec<String>,
    target_features: Vec<String>,
    out_dir: Option<PathBuf>,
    target_dir: Option<PathBuf>,
    quiet_rerun: bool,
}

/// What a build produced.
#[derive(Clone, Debug)]
pub struct PtxOutput {
    /// The PTX file.
    pub path: PathBuf,
    /// The crate name (underscored), also the file stem.
    pub crate_name: String,
    /// False when `DOORBELL_SKIP_PTX` made this a placeholder.
    pub built: bool,
    /// `<crate>.cubin`: the PTX assembled for the arch, or an empty file
    /// when no `ptxas` was found (module docs).
    pub cubin: PathBuf,
    /// True when `cubin` holds a cubin.
    pub cubin_built: bool,
    /// `<crate>.traced.ptx`, the crate built with the device trace's hooks
    /// (`DOORBELL_TRACE_KERNELS=1`), its cubin beside it; `None` when that
    /// file is empty (no traced image).
    pub traced: Option<PathBuf>,
}

impl PtxBuilder {
    /// A builder for the kernel crate at `crate_dir` (relative paths are
    /// resolved against `CARGO_MANIFEST_DIR` in a build script).
    pub fn new(crate_dir: impl AsRef<Path>) -> Self {
        let mut dir = crate_dir.as_ref().to_path_buf();
        if dir.is_relative() {
            if let Ok(m) = std::env::var("CARGO_MANIFEST_DIR") {
                dir = Path::new(&m).join(dir);
            }
        }
        PtxBuilder {
            crate_dir: dir,
            arch: std::env::var("DOORBELL_PTX_ARCH").unwrap_or_else(|_| "sm_90".into()),
            features: Vec::new(),
            target_features: Vec::new(),
            out_dir: None,
            target_dir: std::env::var_os("DOORBELL_PTX_TARGET_DIR").map(PathBuf::from),
            quiet_rerun: false,
        }
    }

    /// GPU architecture (`sm_90` default).
    pub fn arch(mut self, arch: impl Into<String>) -> Self {
        self.arch = arch.into();
        self
    }

    /// Cargo features of the kernel crate to enable.
    pub fn feature(mut self, f: impl Into<String>) -> Self {
        self.features.push(f.into());
        self
    }

    /// An LLVM target feature of the PTX build (`-C target-feature=`),
    /// e.g. `+ptx80`: the PTX ISA version the module declares, which
    /// instructions such as `cp.async.bulk` need (the default for `sm_90`
    /// is 7.8).
    pub fn target_feature(mut self, f: impl Into<String>) -> Self {
        self.target_features.push(f.into());
        self
    }

    /// Where to write `<crate>.ptx` (default `OUT_DIR`).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// The nested build's target directory.
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.target_dir = Some(dir.into());
        self
    }

    /// Do not print `cargo:rerun-if-changed` lines (outside build scripts).
    pub fn no_rerun_directives(mut self) -> Self {
        self.quiet_rerun = true;
        self
    }

    fn crate_name(&self) -> Result<String, BuildError> {
        let manifest = self.crate_dir.join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest).map_err(|e| BuildError::Manifest(manifest.clone(), e))?;
        let mut in_package = false;
        for line in text.lines() {
            let l = line.trim();
            if l.starts_with('[') {
                in_package = l == "[package]";
            } else if in_package && l.starts_with("name") {
                if let Some(v) = l.split('=').nth(1) {
                    return Ok(v.trim().trim_matches('"').replace('-', "_"));
                }
            }
        }
        Err(BuildError::Manifest(manifest, std::io::Error::other("no [package] name")))
    }

    /// [`PtxBuilder::build`] for a build script: on failure, reports the
    /// error as `cargo::error` lines — for a kernel that does not compile,
    /// the compiler's own error diagnostics only (module docs) — and
    /// returns `None`; cargo then fails the build with those lines and
    /// nothing else.
    ///
    /// ```no_run
    /// // in `fn main` of build.rs:
    /// doorbell::build::PtxBuilder::new("../my-kernels").build_or_report();
    /// ```
    pub fn build_or_report(self) -> Option<PtxOutput> {
        let krate = self.crate_dir.display().to_string();
        match self.build() {
            Ok(out) => Some(out),
            Err(e) => {
                for line in e.report_lines(&krate) {
                    println!("cargo::error={line}");
                }
                None
            }
        }
    }

    /// The `rerun-if-*` lines of a build script: the variables the build
    /// reads and the kernel crate's sources.
    fn print_rerun_lines(&self) {
        for v in [
            "DOORBELL_PTXAS",
            "CUDA_HOME",
            "DOORBELL_SKIP_PTX",
            "DOORBELL_PTX_ARCH",
            "DOORBELL_DEVICE_CARGO",
            "DOORBELL_DEVICE_RUSTC",
            "DOORBELL_PTX_TARGET_DIR",
            TRACE_KERNELS_ENV,
        ] {
            println!("cargo:rerun-if-env-changed={v}");
        }
        println!("cargo:rerun-if-changed={}", self.crate_dir.join("Cargo.toml").display());
        println!("cargo:rerun-if-changed={}", self.crate_dir.join("src").display());
    }

    /// Runs the build. In a build script, also prints the `rerun-if-changed`
    /// lines for every source file the kernels were built from.
    ///
    /// Writes `<crate>.ptx` and `<crate>.cubin`, and `<crate>.traced.ptx`
    /// and `<crate>.traced.cubin`: with `DOORBELL_TRACE_KERNELS=1` the
    /// crate built a second time with the device trace's hooks, else empty
    /// files (no traced image; [`crate::ModuleImage`] embeds all four).
    pub fn build(self) -> Result<PtxOutput, BuildError> {
        let out_dir = match &self.out_dir {
            Some(d) => d.clone(),
            None => PathBuf::from(std::env::var_os("OUT_DIR").ok_or(BuildError::NoOutDir)?),
        };
        let crate_name = self.crate_name()?;
        let out_path = out_dir.join(format!("{crate_name}.ptx"));
        let cubin_path = out_dir.join(format!("{crate_name}.cubin"));
        let traced_path = out_dir.join(format!("{crate_name}.traced.ptx"));
        let traced_cubin = out_dir.join(format!("{crate_name}.traced.cubin"));
        let rerun = !self.quiet_rerun && std::env::var_os("OUT_DIR").is_some();
        if rerun {
            self.print_rerun_lines();
        }
        // The device trace's hooks: the crate's own feature when it is
        // doorbell-kernels, else that of its dependency. A build that asks
        // for a `trace` feature itself is traced already: no second image.
        let trace_feature = if crate_name == "doorbell_kernels" {
            "trace"
        } else {
            "doorbell-kernels/trace"
        };
        let traced_twin =
            std::env::var(TRACE_KERNELS_ENV).is_ok_and(|v| v == "1") && !self.features.iter().any(|f| f == "trace" || f == trace_feature);
        if std::env::var("DOORBELL_SKIP_PTX").is_ok_and(|v| v == "1") {
            let out = skipped(&out_dir, out_path, cubin_path, crate_name)?;
            no_traced_image(&traced_path, &traced_cubin)?;
            return Ok(out);
        }

        let cargo = std::env::var("DOORBELL_DEVICE_CARGO").unwrap_or_else(|_| "/usr/bin/cargo".into());
        let rustc = std::env::var("DOORBELL_DEVICE_RUSTC").unwrap_or_else(|_| "/usr/bin/rustc".into());
        check_toolchain(&rustc)?;
        let target_dir = match &self.target_dir {
            Some(d) => d.clone(),
            None => default_target_dir(&out_dir),
        };
        let image = Image {
            cargo: &cargo,
            rustc: &rustc,
            target_dir: &target_dir,
            crate_name: &crate_name,
            out_dir: &out_dir,
            rerun,
        };
        let cubin_built = self.build_image(&image, self.features.clone(), &out_path, &cubin_path)?;
        let traced = if traced_twin {
            let mut features = self.features.clone();
            features.push(trace_feature.to_string());
            self.build_image(&image, features, &traced_path, &traced_cubin)?;
            Some(traced_path)
        } else {
            no_traced_image(&traced_path, &traced_cubin)?;
            None
        };
        Ok(PtxOutput {
            path: out_path,
            crate_name,
            built: true,
            cubin: cubin_path,
            cubin_built,
            traced,
        })
    }

    /// Builds the crate with `features` into `out_path` (PTX) and
    /// `cubin_path`; returns whether the cubin holds one.
    fn build_image(&self, image: &Image<'_>, mut features: Vec<String>, out_path: &Path, cubin_path: &Path) -> Result<bool, BuildError> {
        let Image {
            cargo,
            rustc,
            crate_name,
            out_dir,
            rerun,
            ..
        } = *image;
        let mut target_dir = image.target_dir.to_path_buf();
        if !features.is_empty() {
            // A target directory per feature set: the PTX is an unhashed
            // output, which a build with other features would leave stale.
            features.sort();
            target_dir = target_dir.join(format!("features-{}", features.join("+").replace(['/', ':'], "_")));
        }

        let mut cmd = Command::new(cargo);
        // A clean environment: nothing of the outer (host) build may leak in.
        cmd.env_clear();
        for keep in [
            "PATH",
            "HOME",
            "CARGO_HOME",
            "TMPDIR",
            "CARGO_NET_OFFLINE",
            "http_proxy",
            "https_proxy",
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "CARGO_HTTP_CAINFO",
            "SSL_CERT_FILE",
        ] {
            if let Some(v) = std::env::var_os(keep) {
                cmd.env(keep, v);
            }
        }
        cmd.env("RUSTC", rustc).env("RUSTC_BOOTSTRAP", "1").env("CARGO_TERM_COLOR", "never");
        cmd.arg("rustc")
            .arg("--manifest-path")
            .arg(self.crate_dir.join("Cargo.toml"))
            .args([
                "--lib",
                "--release",
                "--crate-type",
                "cdylib",
                "--target",
                "nvptx64-nvidia-cuda",
                "-Zbuild-std=core",
            ])
            .args(["--config", "profile.release.lto=\"fat\""])
            .args(["--config", "profile.release.panic=\"abort\""])
            .args(["--config", "profile.release.codegen-units=1"])
            .args(["--config", "profile.release.opt-level=3"])
            .args(["--config", "profile.release.debug=false"])
            .args(["--config", "profile.release.incremental=false"])
            .arg("--target-dir")
            .arg(&target_dir);
        if !features.is_empty() {
            cmd.arg("--features").arg(features.join(","));
        }
        cmd.args(["--", "-C", &format!("target-cpu={}", self.arch), "-C", "linker=true", "--emit=asm"]);
        if !self.target_features.is_empty() {
            cmd.arg("-C").arg(format!("target-feature={}", self.target_features.join(",")));
        }
        let output = cmd
            .output()
            .map_err(|e| BuildError::Toolchain(format!("cannot run {cargo}: {e}")))?;
        if !output.status.success() {
            return Err(BuildError::Cargo {
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        let deps = target_dir.join("nvptx64-nvidia-cuda/release/deps");
        let asm = deps.join(format!("{crate_name}.s"));
        if !asm.exists() {
            return Err(BuildError::MissingOutput(asm));
        }
        std::fs::create_dir_all(out_dir).map_err(|e| BuildError::Io(out_dir.to_path_buf(), e))?;
        let ptx = std::fs::read_to_string(&asm).map_err(|e| BuildError::Io(asm.clone(), e))?;
        let ptx = apply_launch_bounds(&ptx);
        std::fs::write(out_path, &ptx).map_err(|e| BuildError::Io(out_path.to_path_buf(), e))?;
        let cubin_built = assemble(&ptx, out_path, cubin_path, &self.arch, &find_ptxas())?;
        if rerun {
            // Every source file the kernels came from (path dependencies too).
            // The dep-info file is named after the crate (no `lib` prefix for
            // the cdylib this build emits; older toolchains wrote `lib<crate>.d`).
            let release = target_dir.join("nvptx64-nvidia-cuda/release");
            let dep_info = [format!("{crate_name}.d"), format!("lib{crate_name}.d")]
                .iter()
                .map(|n| release.join(n))
                .find(|p| p.exists());
            if let Some(text) = dep_info.and_then(|p| std::fs::read_to_string(p).ok()) {
                for path in dep_info_paths(&text) {
                    if !path.contains("/lib/rustlib/") && !path.contains("/.cargo/registry/") {
                        println!("cargo:rerun-if-changed={path}");
                    }
                }
            }
        }
        Ok(cubin_built)
    }
}

/// What both images of one build share.
struct Image<'a> {
    cargo: &'a str,
    rustc: &'a str,
    target_dir: &'a Path,
    crate_name: &'a str,
    out_dir: &'a Path,
    rerun: bool,
}

/// Writes empty `<crate>.traced.ptx` and `.cubin` (no traced image), unless
/// they are empty already (a rewrite would make cargo rebuild the crate
/// that embeds them).
fn no_traced_image(ptx: &Path, cubin: &Path) -> Result<(), BuildError> {
    for p in [ptx, cubin] {
        if !std::fs::metadata(p).is_ok_and(|m| m.len() == 0) {
            std::fs::write(p, []).map_err(|e| BuildError::Io(p.to_path_buf(), e))?;
        }
    }
    let _ = std::fs::remove_file(cubin.with_extension("cubin.src"));
    Ok(())
}

/// Where a `ptxas` comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum PtxasChoice {
    /// `DOORBELL_PTXAS` names it: a failure is an error.
    Named(PathBuf),
    /// Found on its own (PATH, CUDA_HOME, the wheel): a failure is a warning.
    Found(PathBuf),
    /// `DOORBELL_PTXAS=0`: no cubin, on purpose.
    Off,
    /// None anywhere it looked.
    Missing,
}

/// What [`find_ptxas`] searched, for the warning when it found nothing.
const PTXAS_SEARCHED: &str = "DOORBELL_PTXAS, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin and the nvidia-cuda-nvcc wheel of python3";

/// The `ptxas` to use: `DOORBELL_PTXAS` (`0`: none), else one on `PATH`,
/// under `$CUDA_HOME/bin` or `/usr/local/cuda/bin`, else the one of the
/// PyPI wheel `nvidia-cuda-nvcc-cu12` (what `scripts/setup.sh` installs).
fn find_ptxas() -> PtxasChoice {
    if let Some(v) = std::env::var_os("DOORBELL_PTXAS").filter(|v| !v.is_empty()) {
        return if v == "0" {
            PtxasChoice::Off
        } else {
            PtxasChoice::Named(PathBuf::from(v))
        };
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("ptxas")).collect::<Vec<_>>())
        .unwrap_or_default();
    let cuda_home = std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("bin/ptxas"));
    on_path
        .into_iter()
        .chain(cuda_home)
        .chain([PathBuf::from("/usr/local/cuda/bin/ptxas")])
        .find(|p| p.is_file())
        .or_else(wheel_ptxas)
        .map_or(PtxasChoice::Missing, PtxasChoice::Found)
}

/// The `ptxas` inside the `nvidia-cuda-nvcc-cu12` wheel of `python3`, if
/// that wheel is installed.
fn wheel_ptxas() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import nvidia; print(list(nvidia.__path__)[0])"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("cuda_nvcc/bin/ptxas");
    p.is_file().then_some(p)
}

/// Writes `cubin` (module docs): `ptx` (written at `ptx_path`) assembled
/// by the chosen `ptxas` for `arch`, or an empty file without one, saying
/// why (`cargo:warning`). Skips `ptxas` when the cubin was made from this
/// very PTX and arch (a hash beside it says so), and keeps such a cubin when
/// no `ptxas` is found now. A `ptxas` that fails is an error when
/// `DOORBELL_PTXAS` named it, a warning (and no cubin) when it was found on
/// its own. Returns whether `cubin` holds a cubin.
fn assemble(ptx: &str, ptx_path: &Path, cubin: &Path, arch: &str, ptxas: &PtxasChoice) -> Result<bool, BuildError> {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    (ptx, arch).hash(&mut h);
    let stamp = format!("{:016x}", h.finish());
    let stamp_path = cubin.with_extension("cubin.src");
    let current = std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) && std::fs::metadata(cubin).is_ok_and(|m| m.len() > 0);
    let empty = |why: String| -> Result<bool, BuildError> {
        println!(
            "cargo:warning=doorbell: no cubin for {}: {why}; the driver compiles the PTX when the module is first loaded (tens of seconds for a large module)",
            ptx_path.display()
        );
        std::fs::write(cubin, []).map_err(|e| BuildError::Io(cubin.to_path_buf(), e))?;
        let _ = std::fs::remove_file(&stamp_path);
        Ok(false)
    };
    let (ptxas, explicit) = match ptxas {
        PtxasChoice::Named(p) => (p, true),
        PtxasChoice::Found(p) => (p, false),
        PtxasChoice::Off => return empty("DOORBELL_PTXAS=0 asks for none".into()),
        // A cubin of this very PTX stays: nothing it was made from changed.
        PtxasChoice::Missing if current => return Ok(true),
        PtxasChoice::Missing => {
            return empty(format!(
                "no ptxas found (looked at {PTXAS_SEARCHED}); run scripts/setup.sh or set DOORBELL_PTXAS"
            ))
        }
    };
    if current {
        return Ok(true);
    }
    let tmp = cubin.with_extension("cubin.tmp");
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg(ptx_path)
        .arg("-o")
        .arg(&tmp)
        .output();
    let failure = match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "{} failed ({}): {}",
            ptxas.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run {}: {e}", ptxas.display())),
    };
    if let Some(f) = failure {
        let _ = std::fs::remove_file(&tmp);
        if explicit {
            return Err(BuildError::Ptxas(f));
        }
        return empty(f);
    }
    std::fs::rename(&tmp, cubin).map_err(|e| BuildError::Io(cubin.to_path_buf(), e))?;
    std::fs::write(&stamp_path, stamp).map_err(|e| BuildError::Io(stamp_path.clone(), e))?;
    Ok(true)
}

/// The error diagnostics of a nested cargo's stderr: every block that
/// starts with `error` (up to the next blank line or the next diagnostic),
/// without warnings (the library's among them) and progress lines.
fn error_diagnostics(stderr: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut keep = false;
    for line in stderr.lines() {
        let head = line.trim_start();
        let starts_diagnostic = !line.starts_with(' ') && (line.starts_with("error") || line.starts_with("warning"));
        if starts_diagnostic {
            keep = line.starts_with("error") && !line.starts_with("error: could not compile") && !head.starts_with("error: aborting");
        } else if head.starts_with("Compiling ")
            || head.starts_with("Finished ")
            || head.starts_with("Updating ")
            || head.starts_with("Locking ")
        {
            keep = false;
            continue;
        }
        if keep {
            out.push(line);
        }
    }
    while out.last().is_some_and(|l| l.trim().is_empty()) {
        out.pop();
    }
    out
}

fn check_toolchain(rustc: &str) -> Result<(), BuildError> {
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| BuildError::Toolchain(format!("cannot run {rustc}: {e}")))?;
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let core = Path::new(&sysroot).join("lib/rustlib/src/rust/library/core");
    if !core.exists() {
        return Err(BuildError::Toolchain(format!(
            "{rustc} has no core source at {} (needed by -Zbuild-std)",
            core.display()
        )));
    }
    Ok(())
}

/// `<target>/doorbell-ptx`, found as the ancestor of `OUT_DIR` that cargo
/// marked with `CACHEDIR.TAG`.
fn default_target_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|a| a.join("CACHEDIR.TAG").exists())
        .map(|t| t.join("doorbell-ptx"))
        .unwrap_or_else(|| out_dir.join("doorbell-ptx"))
}

/// Writes the `.maxntid N, 1, 1` and `.minnctapersm M` directives of every
/// entry marked `#[kernel(launch_bounds(threads = N, min_blocks = M))]`:
/// the macro leaves a global `DOORBELL_BOUNDS_<N>_<M>_<entry>` (rustc has
/// no attribute for these directives), and they go between the entry's
/// parameter list and its body, where PTX wants them.
fn apply_launch_bounds(ptx: &str) -> String {
    const MARK: &str = "DOORBELL_BOUNDS_";
    let mut bounds: Vec<(String, String, String)> = Vec::new();
    for line in ptx.lines().filter(|l| l.contains(".global")) {
        let Some(at) = line.find(MARK) else { continue };
        let name: String = line[at + MARK.len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let mut parts = name.splitn(3, '_');
        if let (Some(n), Some(m), Some(entry)) = (parts.next(), parts.next(), parts.next()) {
            bounds.push((n.to_string(), m.to_string(), entry.to_string()));
        }
    }
    if bounds.is_empty() {
        return ptx.to_string();
    }
    let mut out = String::with_capacity(ptx.len() + 64 * bounds.len());
    let mut pending: Option<(String, String)> = None;
    for line in ptx.lines() {
        if pending.is_none() {
            let head = line.trim_start();
            if let Some(rest) = head.strip_prefix(".visible .entry ").or_else(|| head.strip_prefix(".entry ")) {
                let entry = rest.split('(').next().unwrap_or("").trim();
                if let Some((n, m, _)) = bounds.iter().find(|(_, _, e)| e == entry) {
                    pending = Some((n.clone(), m.clone()));
                }
            }
        }
        out.push_str(line);
        out.push('\n');
        // The parameter list ends with a line `)` (or on the entry's line).
        if let Some((n, m)) = &pending {
            if line.trim_end().ends_with(')') {
                out.push_str(&format!(".maxntid {n}, 1, 1\n.minnctapersm {m}\n"));
                pending = None;
            }
        }
    }
    out
}

/// Paths listed in a Makefile-style dep-info file.
fn dep_info_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((_, deps)) = line.split_once(": ") else { continue };
        let mut cur = String::new();
        let mut chars = deps.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => {
                    cur.push(' ');
                    chars.next();
                }
                ' ' => {
                    if !cur.is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                }
                _ => cur.push(c),
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
    }
    out
}

/// The outputs of a build skipped by `DOORBELL_SKIP_PTX=1`: a placeholder
/// PTX and an empty cubin.
fn skipped(out_dir: &Path, out_path: PathBuf, cubin_path: PathBuf, crate_name: String) -> Result<PtxOutput, BuildError> {
    std::fs::create_dir_all(out_dir).map_err(|e| BuildError::Io(out_dir.to_path_buf(), e))?;
    std::fs::write(&out_path, "// doorbell: PTX build skipped (DOORBELL_SKIP_PTX=1)\n").map_err(|e| BuildError::Io(out_path.clone(), e))?;
    std::fs::write(&cubin_path, []).map_err(|e| BuildError::Io(cubin_path.clone(), e))?;
    Ok(PtxOutput {
        path: out_path,
        crate_name,
        built: false,
        cubin: cubin_path,
        cubin_built: false,
        traced: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in `ptxas` (a shell script) that writes the PTX's first line
    /// as the "cubin" and counts its runs; `fail` makes it exit 1.
    fn fake_ptxas(dir: &Path, fail: bool) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join("ptxas");
        let body = if fail {
            "#!/bin/sh\necho 'ptxas fatal: bad PTX' >&2\nexit 1\n".to_string()
        } else {
            format!(
                "#!/bin/sh\n# $1=-arch=.. $2=ptx $3=-o $4=out\necho run >> {}/runs\nhead -n 1 \"$2\" > \"$4\"\n",
                dir.display()
            )
        };
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn a_cubin_is_assembled_once_per_ptx_and_never_replaced_by_an_empty_one() {
        let dir = std::env::temp_dir().join(format!("doorbell-assemble-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (ptx_path, cubin) = (dir.join("k.ptx"), dir.join("k.cubin"));
        let runs = || std::fs::read_to_string(dir.join("runs")).map(|s| s.lines().count()).unwrap_or(0);
        // No ptxas and no cubin yet: an empty file, so include_bytes! works.
        std::fs::write(&ptx_path, "first\n").unwrap();
        assert!(!assemble("first\n", &ptx_path, &cubin, "sm_90", &PtxasChoice::Missing).unwrap());
        assert_eq!(std::fs::read(&cubin).unwrap(), b"");
        // With one: assembled; the same PTX again: not re-run.
        let ptxas = PtxasChoice::Named(fake_ptxas(&dir, false));
        assert!(assemble("first\n", &ptx_path, &cubin, "sm_90", &ptxas).unwrap());
        assert!(assemble("first\n", &ptx_path, &cubin, "sm_90", &ptxas).unwrap());
        assert_eq!((std::fs::read_to_string(&cubin).unwrap().as_str(), runs()), ("first\n", 1));
        // The same PTX with no ptxas found any more: the cubin of this very
        // PTX stays.
        assert!(assemble("first\n", &ptx_path, &cubin, "sm_90", &PtxasChoice::Missing).unwrap());
        assert_eq!((std::fs::read_to_string(&cubin).unwrap().as_str(), runs()), ("first\n", 1));
        // Changed PTX, or another arch: assembled again.
        std::fs::write(&ptx_path, "second\n").unwrap();
        assert!(assemble("second\n", &ptx_path, &cubin, "sm_90", &ptxas).unwrap());
        assert!(assemble("second\n", &ptx_path, &cubin, "sm_100", &ptxas).unwrap());
        assert_eq!((std::fs::read_to_string(&cubin).unwrap().as_str(), runs()), ("second\n", 3));
        // Changed PTX without a ptxas: the old cubin would be wrong, so empty.
        assert!(!assemble("third\n", &ptx_path, &cubin, "sm_100", &PtxasChoice::Missing).unwrap());
        assert_eq!(std::fs::read(&cubin).unwrap(), b"");
        // DOORBELL_PTXAS=0 asks for none, even of the same PTX.
        assert!(assemble("second\n", &ptx_path, &cubin, "sm_90", &ptxas).unwrap());
        assert!(!assemble("second\n", &ptx_path, &cubin, "sm_90", &PtxasChoice::Off).unwrap());
        assert_eq!(std::fs::read(&cubin).unwrap(), b"");
        // A failing ptxas: an error when named, no cubin when found alone.
        let bad = fake_ptxas(
            &std::env::temp_dir().join(format!("doorbell-assemble-bad-{}", std::process::id())),
            true,
        );
        let err = assemble("third\n", &ptx_path, &cubin, "sm_90", &PtxasChoice::Named(bad.clone())).unwrap_err();
        assert!(err.to_string().contains("bad PTX"), "{err}");
        assert!(!assemble("third\n", &ptx_path, &cubin, "sm_90", &PtxasChoice::Found(bad.clone())).unwrap());
        assert_eq!(std::fs::read(&cubin).unwrap(), b"");
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(bad.parent().unwrap());
    }

    #[test]
    fn compile_errors_are_reported_without_warnings_or_progress_lines() {
        let stderr = "   Compiling doorbell-kernels v0.1.0 (/x/gpu-kernels)\n\
warning: unused variable: `y`\n --> /x/gpu-kernels/src/lib.rs:9:9\n  |\n9 |     let y = 1;\n  |         ^\n\n\
   Compiling my-kernels v0.1.0 (/x/my-kernels)\n\
error[E0308]: mismatched types\n --> src/lib.rs:3:5\n  |\n3 |     x\n  |     ^ expected `u32`, found `u64`\n\n\
error: could not compile `my-kernels` (lib) due to 1 previous error\n";
        let lines = BuildError::Cargo {
            status: "exit status: 101".into(),
            stderr: stderr.into(),
        }
        .report_lines("../my-kernels");
        assert_eq!(
            lines[0],
            "the kernel crate ../my-kernels did not compile for the GPU (exit status: 101):"
        );
        assert_eq!(
            &lines[1..],
            [
                "error[E0308]: mismatched types",
                " --> src/lib.rs:3:5",
                "  |",
                "3 |     x",
                "  |     ^ expected `u32`, found `u64`"
            ]
        );
        // Other errors: one line.
        let other = BuildError::NoOutDir.report_lines("k");
        assert_eq!(other.len(), 1);
        assert!(other[0].starts_with("PTX build of k: OUT_DIR is not set"), "{other:?}");
    }

    #[test]
    fn launch_bounds_go_between_parameters_and_body() {
        let ptx = ".visible .global .align 1 .u8 DOORBELL_BOUNDS_512_2_k_p2p;\n\
                   .visible .entry k_p2p(\n\t.param .u64 k_p2p_param_0\n)\n{\n\tret;\n}\n\
                   .visible .entry other()\n{\n\tret;\n}\n";
        let got = apply_launch_bounds(ptx);
        assert!(
            got.contains(".param .u64 k_p2p_param_0\n)\n.maxntid 512, 1, 1\n.minnctapersm 2\n{"),
            "{got}"
        );
        assert_eq!(got.matches(".maxntid").count(), 1, "only the marked entry: {got}");
        let plain = ".visible .entry other()\n{\n\tret;\n}\n";
        assert_eq!(apply_launch_bounds(plain), plain);
    }

    #[test]
    fn dep_info_parsing_handles_escaped_spaces() {
        let d = "/t/x.so: /a/b.rs /c/d\\ e.rs\n/t/y: /f.rs\n";
        assert_eq!(dep_info_paths(d), vec!["/a/b.rs", "/c/d e.rs", "/f.rs"]);
    }

    #[test]
    fn target_dir_falls_back_to_out_dir() {
        let p = Path::new("/nonexistent/out");
        assert_eq!(default_target_dir(p), p.join("doorbell-ptx"));
    }

    #[test]
    fn crate_name_is_read_from_the_manifest() {
        let dir = std::env::temp_dir().join(format!("doorbell-build-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"my-kernels\"\nversion = \"0.1.0\"\n").unwrap();
        assert_eq!(PtxBuilder::new(&dir).crate_name().unwrap(), "my_kernels");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
