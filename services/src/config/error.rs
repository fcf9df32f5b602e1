//! Why a configuration was refused, and where: [`ConfigError`], and the
//! [`Source`] that turns a value's place in the text into
//! `file:line:column` and checks numbers against their ranges.

use std::fmt;
use std::ops::Range;

use toml::Spanned;

use super::bounds::Bounds;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not valid TOML, or a field has the wrong type.
    #[error("{file}:{line}:{column}: {message}")]
    Syntax {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What was wrong and what was expected.
        message: String,
    },
    /// A field's value is not acceptable.
    #[error("{file}:{line}:{column}: field `{field}`: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The field.
        field: String,
        /// What was expected.
        message: String,
    },
    /// A number is outside the range its field allows.
    #[error("{file}:{line}:{column}: field `{field}`: {value} is out of range {bounds}")]
    OutOfRange {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The field.
        field: String,
        /// The value found.
        value: i64,
        /// The values allowed.
        bounds: Bounds,
    },
    /// A value clashes with another place in the file (the same device
    /// number twice, two listeners on one address, …).
    #[error("{file}:{line}:{column}: field `{field}`: {message}; the other is {other}")]
    Conflict {
        /// The file.
        file: String,
        /// 1-based line of the second place.
        line: usize,
        /// 1-based column of the second place.
        column: usize,
        /// The field at the second place.
        field: String,
        /// What clashes.
        message: String,
        /// The first place: its field and `file:line:column`, or that it
        /// is a default.
        other: String,
    },
}

/// Where a value came from, for error messages.
#[derive(Clone, Debug)]
pub(crate) struct Source<'a> {
    pub(crate) file: &'a str,
    pub(crate) text: &'a str,
}

impl Source<'_> {
    /// The text as TOML of shape `T`; a syntax error with its line and
    /// column.
    pub(crate) fn toml<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConfigError> {
        toml::from_str(self.text).map_err(|e| {
            let (line, column) = e.span().map_or((1, 1), |s| self.position(s.start));
            ConfigError::Syntax {
                file: self.file.to_owned(),
                line,
                column,
                message: e.message().to_owned(),
            }
        })
    }

    /// 1-based line and column of `offset`.
    pub(crate) fn position(&self, offset: usize) -> (usize, usize) {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before
            .rfind('\n')
            .map_or(before.len(), |i| before.len() - i - 1)
            + 1;
        (line, column)
    }

    pub(crate) fn invalid<T>(
        &self,
        span: Range<usize>,
        field: &str,
        message: impl fmt::Display,
    ) -> Result<T, ConfigError> {
        let (line, column) = self.position(span.start);
        Err(ConfigError::Invalid {
            file: self.file.to_owned(),
            line,
            column,
            field: field.to_owned(),
            message: message.to_string(),
        })
    }

    /// `value` as a `T` when it is within `bounds`.
    pub(super) fn number<T: TryFrom<i64>>(
        &self,
        value: &Spanned<i64>,
        field: &str,
        bounds: Bounds,
    ) -> Result<T, ConfigError> {
        let v = *value.get_ref();
        match T::try_from(v) {
            Ok(n) if bounds.contains(v) => Ok(n),
            _ => {
                let (line, column) = self.position(value.span().start);
                Err(ConfigError::OutOfRange {
                    file: self.file.to_owned(),
                    line,
                    column,
                    field: field.to_owned(),
                    value: v,
                    bounds,
                })
            }
        }
    }

    /// [`Source::number`] of a field that may be absent: `default` then.
    pub(super) fn number_or<T: TryFrom<i64>>(
        &self,
        value: Option<&Spanned<i64>>,
        default: T,
        field: &str,
        bounds: Bounds,
    ) -> Result<T, ConfigError> {
        value.map_or(Ok(default), |v| self.number(v, field, bounds))
    }

    /// `span`'s place as `file:line:column`.
    pub(crate) fn place(&self, span: Range<usize>) -> String {
        let (line, column) = self.position(span.start);
        format!("{}:{line}:{column}", self.file)
    }

    /// A [`ConfigError::Conflict`] at `span`.
    pub(crate) fn conflict<T>(
        &self,
        span: Range<usize>,
        field: &str,
        message: impl fmt::Display,
        other: impl fmt::Display,
    ) -> Result<T, ConfigError> {
        let (line, column) = self.position(span.start);
        Err(ConfigError::Conflict {
            file: self.file.to_owned(),
            line,
            column,
            field: field.to_owned(),
            message: message.to_string(),
            other: other.to_string(),
        })
    }
}
