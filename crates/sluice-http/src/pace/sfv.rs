//! Structured field Lists (RFC 9651 §4.2.1), as much as the IETF limit fields need: items,
//! inner lists and parameters, the whole field refused when any of it is invalid.

/// A bare item of a structured field.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A String.
    String(String),
    /// A Token.
    Token(String),
    /// An Integer.
    Integer(i64),
    /// A Decimal.
    Decimal(f64),
    /// A Boolean.
    Boolean(bool),
    /// A Byte Sequence, as its base64 text.
    Bytes(String),
    /// An Inner List.
    Inner(Vec<Member>),
}

/// A list member: an item and its parameters, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The item.
    pub item: Item,
    /// Its parameters.
    pub params: Vec<(String, Item)>,
}

impl Member {
    pub(crate) fn param(&self, key: &str) -> Option<&Item> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
    pub(crate) fn count(&self, key: &str) -> Option<u64> {
        match self.param(key) {
            Some(Item::Integer(n)) if *n >= 0 => Some(*n as u64),
            _ => None,
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.i += 1;
        }
    }
    fn ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }
    fn bare(&mut self) -> Option<Item> {
        match self.peek()? {
            b'"' => {
                self.i += 1;
                let mut out = String::new();
                loop {
                    let c = self.peek()?;
                    self.i += 1;
                    match c {
                        b'\\' => {
                            let n = self.peek()?;
                            if n != b'"' && n != b'\\' {
                                return None;
                            }
                            out.push(n as char);
                            self.i += 1;
                        }
                        b'"' => return Some(Item::String(out)),
                        0x20..=0x7e => out.push(c as char),
                        _ => return None,
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = self.i;
                if self.peek() == Some(b'-') {
                    self.i += 1;
                }
                let digits = self.i;
                while matches!(self.peek(), Some(b'0'..=b'9')) {
                    self.i += 1;
                }
                let int_len = self.i - digits;
                if int_len == 0 {
                    return None;
                }
                if self.peek() == Some(b'.') {
                    self.i += 1;
                    let frac = self.i;
                    while matches!(self.peek(), Some(b'0'..=b'9')) {
                        self.i += 1;
                    }
                    let frac_len = self.i - frac;
                    if int_len > 12 || frac_len == 0 || frac_len > 3 {
                        return None;
                    }
                    let t = std::str::from_utf8(&self.s[start..self.i]).ok()?;
                    return t.parse().ok().map(Item::Decimal);
                }
                if int_len > 15 {
                    return None;
                }
                let t = std::str::from_utf8(&self.s[start..self.i]).ok()?;
                t.parse().ok().map(Item::Integer)
            }
            b'?' => {
                let b = *self.s.get(self.i + 1)?;
                self.i += 2;
                match b {
                    b'0' => Some(Item::Boolean(false)),
                    b'1' => Some(Item::Boolean(true)),
                    _ => None,
                }
            }
            b':' => {
                let rest = &self.s[self.i + 1..];
                let end = rest.iter().position(|&b| b == b':')?;
                let body = &rest[..end];
                if !body
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
                {
                    return None;
                }
                self.i += end + 2;
                Some(Item::Bytes(String::from_utf8_lossy(body).into_owned()))
            }
            c if c.is_ascii_alphabetic() || c == b'*' => {
                let start = self.i;
                while matches!(self.peek(), Some(b) if b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b))
                {
                    self.i += 1;
                }
                Some(Item::Token(
                    String::from_utf8_lossy(&self.s[start..self.i]).into_owned(),
                ))
            }
            _ => None,
        }
    }
    fn params(&mut self) -> Option<Vec<(String, Item)>> {
        let mut out = Vec::new();
        while self.peek() == Some(b';') {
            self.i += 1;
            self.sp();
            if !matches!(self.peek(), Some(b'a'..=b'z' | b'*')) {
                return None;
            }
            let start = self.i;
            while matches!(
                self.peek(),
                Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')
            ) {
                self.i += 1;
            }
            let key = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
            let value = if self.peek() == Some(b'=') {
                self.i += 1;
                self.bare()?
            } else {
                Item::Boolean(true)
            };
            out.push((key, value));
        }
        Some(out)
    }
    fn member(&mut self) -> Option<Member> {
        if self.peek() == Some(b'(') {
            self.i += 1;
            let mut inner = Vec::new();
            loop {
                self.sp();
                if self.peek() == Some(b')') {
                    self.i += 1;
                    return Some(Member {
                        item: Item::Inner(inner),
                        params: self.params()?,
                    });
                }
                let item = self.bare()?;
                inner.push(Member {
                    item,
                    params: self.params()?,
                });
                if !matches!(self.peek(), Some(b' ' | b')')) {
                    return None;
                }
            }
        }
        let item = self.bare()?;
        Some(Member {
            item,
            params: self.params()?,
        })
    }
}

/// A structured field List (RFC 9651 §4.2.1), or `None` when the text is not one (the RFC
/// fails the whole field then).
pub fn parse_list(text: &str) -> Option<Vec<Member>> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let mut out = Vec::new();
    p.sp();
    while p.i < p.s.len() {
        out.push(p.member()?);
        p.ows();
        if p.i >= p.s.len() {
            return Some(out);
        }
        if p.peek() != Some(b',') {
            return None;
        }
        p.i += 1;
        p.ows();
        if p.i >= p.s.len() {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_follow_rfc_9651() {
        let l = parse_list(r#""a,b;c";r=1, tok;t=2.5;f=?0;k=:AQI=:"#).unwrap();
        assert_eq!(l[0].item, Item::String("a,b;c".into()));
        assert_eq!(l[0].count("r"), Some(1));
        assert_eq!(l[1].item, Item::Token("tok".into()));
        assert_eq!(l[1].param("t"), Some(&Item::Decimal(2.5)));
        assert_eq!(l[1].param("k"), Some(&Item::Bytes("AQI=".into())));
        assert_eq!(parse_list("(1 2);x, 3").unwrap().len(), 2);
        for bad in [
            r#""unterminated"#,
            r#""a","#,
            r#""a" "b""#,
            r#""a";Q=1"#,
            "1234567890123456",
            r#""a";q="#,
            "?2",
            r#""a";q=1.2345"#,
        ] {
            assert_eq!(parse_list(bad), None, "{bad}");
        }
    }
}
