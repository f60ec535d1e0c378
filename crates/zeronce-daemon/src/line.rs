//! Reading one request line of a line-oriented socket, bounded: at most a given number
//! of bytes, and UTF-8, so that a client can neither grow the daemon's buffer without
//! limit nor get its connection closed without a word by sending bytes that are not text.

use std::io::{self, BufRead, Read};

/// One line read by [`read_line`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    /// End of stream before any byte.
    Eof,
    /// A line (its newline, if any, included).
    Text(String),
    /// More than the limit without a newline; the rest of the line is left unread (the
    /// caller answers and closes).
    TooLong,
    /// A line that is not UTF-8; the line was consumed, the connection can go on.
    NotUtf8,
}

/// Reads a line of at most `max` bytes (newline included) from `r`. Errors are the
/// reader's (a read timeout: `WouldBlock` / `TimedOut`).
pub fn read_line(r: &mut impl BufRead, max: usize) -> io::Result<Line> {
    let mut buf = Vec::new();
    let n = r.take(max as u64 + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(Line::Eof);
    }
    if n > max {
        return Ok(Line::TooLong);
    }
    Ok(String::from_utf8(buf).map_or(Line::NotUtf8, Line::Text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_long_lines_bad_bytes_and_the_end() {
        let mut r = io::Cursor::new(b"{\"op\":1}\n\xff\xfe\n0123456789abc\n".to_vec());
        assert_eq!(
            read_line(&mut r, 12).unwrap(),
            Line::Text("{\"op\":1}\n".into())
        );
        assert_eq!(read_line(&mut r, 12).unwrap(), Line::NotUtf8);
        assert_eq!(read_line(&mut r, 12).unwrap(), Line::TooLong);
        let mut r = io::Cursor::new(b"last".to_vec());
        assert_eq!(read_line(&mut r, 12).unwrap(), Line::Text("last".into()));
        assert_eq!(read_line(&mut r, 12).unwrap(), Line::Eof);
    }
}
