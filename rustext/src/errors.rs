//! The Python exception tree of `rustext`, built once per interpreter.
//!
//! ```text
//! RustextError(Exception)
//! ├── DecodeError(RustextError, ValueError)     malformed input
//! │   ├── FrameTooLarge(DecodeError)            a length over the configured maximum
//! │   ├── RpcxDecodeError(DecodeError)          an invalid rpcx message
//! │   └── JugglerDecodeError(DecodeError)       an invalid juggler.0 message
//! └── BalancerError(RustextError)               data-plane failures
//!     └── BalancerConfigError(BalancerError, ValueError)
//! ```
//!
//! Rust code returns its own error enums; they turn into these classes only
//! at the boundary, through [`ErrorKind::err`]. Classes with two bases are
//! made with `type(...)` because PyO3's `create_exception!` takes one base.

use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

/// Every exception class rustext raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Rustext,
    Decode,
    FrameTooLarge,
    RpcxDecode,
    JugglerDecode,
    Balancer,
    BalancerConfig,
}

const ALL: [ErrorKind; 7] = [
    ErrorKind::Rustext,
    ErrorKind::Decode,
    ErrorKind::FrameTooLarge,
    ErrorKind::RpcxDecode,
    ErrorKind::JugglerDecode,
    ErrorKind::Balancer,
    ErrorKind::BalancerConfig,
];

impl ErrorKind {
    fn name(self) -> &'static str {
        match self {
            ErrorKind::Rustext => "RustextError",
            ErrorKind::Decode => "DecodeError",
            ErrorKind::FrameTooLarge => "FrameTooLarge",
            ErrorKind::RpcxDecode => "RpcxDecodeError",
            ErrorKind::JugglerDecode => "JugglerDecodeError",
            ErrorKind::Balancer => "BalancerError",
            ErrorKind::BalancerConfig => "BalancerConfigError",
        }
    }

    fn doc(self) -> &'static str {
        match self {
            ErrorKind::Rustext => "Root of every error raised by rustext.",
            ErrorKind::Decode => "Malformed or out-of-limit input.",
            ErrorKind::FrameTooLarge => "A frame length over the configured maximum (raised before buffering).",
            ErrorKind::RpcxDecode => "An invalid rpcx message.",
            ErrorKind::JugglerDecode => "An invalid juggler.0 message.",
            ErrorKind::Balancer => "A failure of the load balancer's data plane.",
            ErrorKind::BalancerConfig => "An invalid load balancer configuration.",
        }
    }

    fn slot(self) -> &'static PyOnceLock<Py<PyType>> {
        static SLOTS: [PyOnceLock<Py<PyType>>; 7] = [
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
        ];
        &SLOTS[self as usize]
    }

    /// The Python class of this kind, created on first use.
    pub fn class<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyType>> {
        let ty = self
            .slot()
            .get_or_try_init(py, || -> PyResult<Py<PyType>> {
                let bases: Bound<'_, PyTuple> = match self {
                    ErrorKind::Rustext => PyTuple::new(py, [py.get_type::<PyException>()])?,
                    ErrorKind::Decode => PyTuple::new(
                        py,
                        [ErrorKind::Rustext.class(py)?, py.get_type::<PyValueError>()],
                    )?,
                    ErrorKind::FrameTooLarge | ErrorKind::RpcxDecode | ErrorKind::JugglerDecode => {
                        PyTuple::new(py, [ErrorKind::Decode.class(py)?])?
                    }
                    ErrorKind::Balancer => PyTuple::new(py, [ErrorKind::Rustext.class(py)?])?,
                    ErrorKind::BalancerConfig => PyTuple::new(
                        py,
                        [ErrorKind::Balancer.class(py)?, py.get_type::<PyValueError>()],
                    )?,
                };
                let ns = PyDict::new(py);
                ns.set_item("__module__", "rustext")?;
                ns.set_item("__doc__", self.doc())?;
                let builtins = py.import("builtins")?;
                let cls = builtins
                    .getattr("type")?
                    .call1((self.name(), bases, ns))?
                    .cast_into::<PyType>()?;
                Ok(cls.unbind())
            })?;
        Ok(ty.bind(py).clone())
    }

    /// A `PyErr` of this kind carrying `msg`.
    pub fn err(self, msg: impl Into<String>) -> PyErr {
        let msg = msg.into();
        Python::attach(|py| match self.class(py) {
            Ok(cls) => PyErr::from_type(cls, msg),
            Err(e) => e,
        })
    }
}

/// Register every exception class on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for kind in ALL {
        m.add(kind.name(), kind.class(py)?)?;
    }
    Ok(())
}
