//! Just enough JSON for the benchmark lines: flat objects whose values are strings, numbers,
//! booleans or `null` — parsed and written by hand (xtask has no JSON dependency).

/// One JSON value of a flat object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// A string.
    Str(String),
    /// A number (every JSON number, as `f64`).
    Num(f64),
    /// `true` or `false`.
    Bool(bool),
    /// `null`.
    Null,
}

/// A flat JSON object: its members in the order written.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Object(pub(crate) Vec<(String, Value)>);

impl Object {
    /// Parses one flat object (`{"a":1,"b":"x"}`); surrounding whitespace is allowed, nested
    /// objects and arrays are not.
    pub(crate) fn parse(text: &str) -> Result<Object, String> {
        let mut p = Parser { s: text.as_bytes(), i: 0 };
        p.ws();
        p.expect(b'{')?;
        let mut members = Vec::new();
        p.ws();
        if p.peek() == Some(b'}') {
            p.i += 1;
        } else {
            loop {
                p.ws();
                let key = p.string()?;
                p.ws();
                p.expect(b':')?;
                p.ws();
                let value = p.value()?;
                if members.iter().any(|(k, _): &(String, Value)| *k == key) {
                    return Err(format!("duplicate key {key:?}"));
                }
                members.push((key, value));
                p.ws();
                match p.next() {
                    Some(b',') => continue,
                    Some(b'}') => break,
                    _ => return Err(p.error("',' or '}'")),
                }
            }
        }
        p.ws();
        if p.i != p.s.len() {
            return Err(p.error("the end of the line"));
        }
        Ok(Object(members))
    }

    /// The value of `key`, if present.
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The string member `key`, or an error naming it.
    pub(crate) fn str(&self, key: &str) -> Result<&str, String> {
        match self.get(key) {
            Some(Value::Str(s)) => Ok(s),
            Some(v) => Err(format!("{key:?} should be a string, not {v:?}")),
            None => Err(format!("missing {key:?}")),
        }
    }

    /// The number member `key`, or an error naming it.
    pub(crate) fn num(&self, key: &str) -> Result<f64, String> {
        match self.get(key) {
            Some(Value::Num(n)) => Ok(*n),
            Some(v) => Err(format!("{key:?} should be a number, not {v:?}")),
            None => Err(format!("missing {key:?}")),
        }
    }

    /// The non-negative whole-number member `key`.
    pub(crate) fn uint(&self, key: &str) -> Result<u64, String> {
        let n = self.num(key)?;
        if n < 0.0 || n.fract() != 0.0 || n > 2f64.powi(53) {
            return Err(format!("{key:?} should be a whole number, not {n}"));
        }
        Ok(n as u64)
    }

    /// The boolean member `key`, or an error naming it.
    pub(crate) fn bool(&self, key: &str) -> Result<bool, String> {
        match self.get(key) {
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(format!("{key:?} should be true or false, not {v:?}")),
            None => Err(format!("missing {key:?}")),
        }
    }

    /// Appends a member.
    pub(crate) fn push(&mut self, key: &str, value: Value) -> &mut Self {
        self.0.push((key.to_string(), value));
        self
    }
}

impl std::fmt::Display for Object {
    /// Writes the object on one line, members in order; non-finite numbers become `null`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write_string(f, k)?;
            f.write_str(":")?;
            match v {
                Value::Str(s) => write_string(f, s)?,
                Value::Num(n) if n.is_finite() => write!(f, "{n}")?,
                Value::Num(_) | Value::Null => f.write_str("null")?,
                Value::Bool(b) => write!(f, "{b}")?,
            }
        }
        f.write_str("}")
    }
}

fn write_string(f: &mut impl std::fmt::Write, s: &str) -> std::fmt::Result {
    f.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\t' => f.write_str("\\t")?,
            '\r' => f.write_str("\\r")?,
            c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
            c => f.write_char(c)?,
        }
    }
    f.write_char('"')
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.i += 1;
        }
    }

    fn error(&self, wanted: &str) -> String {
        match self.peek() {
            Some(c) => format!("expected {wanted} at byte {}, found {:?}", self.i, c as char),
            None => format!("expected {wanted} at byte {}, found the end", self.i),
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.error(&format!("{:?}", c as char)))
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        match self.peek() {
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b't') => self.word("true", Value::Bool(true)),
            Some(b'f') => self.word("false", Value::Bool(false)),
            Some(b'n') => self.word("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'{' | b'[') => Err(format!("nested objects and arrays are not supported (byte {})", self.i)),
            _ => Err(self.error("a value")),
        }
    }

    fn word(&mut self, w: &str, v: Value) -> Result<Value, String> {
        if self.s[self.i..].starts_with(w.as_bytes()) {
            self.i += w.len();
            Ok(v)
        } else {
            Err(self.error(w))
        }
    }

    fn number(&mut self) -> Result<Value, String> {
        let start = self.i;
        while matches!(self.peek(), Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')) {
            self.i += 1;
        }
        // The byte range holds only ASCII, so it is valid UTF-8.
        let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
        let valid_start = text.strip_prefix('-').unwrap_or(text).starts_with(|c: char| c.is_ascii_digit());
        match text.parse::<f64>() {
            Ok(n) if valid_start && n.is_finite() => Ok(Value::Num(n)),
            _ => Err(format!("bad number {text:?} at byte {start}")),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = Vec::new();
        loop {
            match self.next() {
                None => return Err("unterminated string".into()),
                Some(b'"') => break,
                Some(b'\\') => {
                    let c = match self.next() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => self.unicode()?,
                        _ => return Err(format!("bad escape at byte {}", self.i.saturating_sub(1))),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                Some(c) if c < 0x20 => return Err(format!("control character in a string at byte {}", self.i - 1)),
                Some(c) => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| "a string is not valid UTF-8".to_string())
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self.s.get(self.i..self.i + 4).ok_or("truncated \\u escape")?;
        let text = std::str::from_utf8(digits).map_err(|_| "bad \\u escape")?;
        let v = u32::from_str_radix(text, 16).map_err(|_| format!("bad \\u escape {text:?}"))?;
        self.i += 4;
        Ok(v)
    }

    fn unicode(&mut self) -> Result<char, String> {
        let hi = self.hex4()?;
        let code = if (0xd800..0xdc00).contains(&hi) {
            if !self.s[self.i..].starts_with(b"\\u") {
                return Err("unpaired surrogate in \\u escape".into());
            }
            self.i += 2;
            let lo = self.hex4()?;
            if !(0xdc00..0xe000).contains(&lo) {
                return Err("unpaired surrogate in \\u escape".into());
            }
            0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
        } else {
            hi
        };
        char::from_u32(code).ok_or_else(|| format!("bad \\u escape {code:#x}"))
    }
}

/// Writes `s` as a JSON string literal into a `String`.
#[cfg(test)]
fn quoted(s: &str) -> String {
    let mut out = String::new();
    let _ = write_string(&mut out, s);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flat_objects() {
        let o = Object::parse(
            r#" {"op":"all_reduce","bytes":8,"t":1.5e-3,"neg":-2,"ok":true,"no":false,"w":null,"s":"a\"\\\u00e9\ud83d\ude00"} "#,
        )
        .unwrap();
        assert_eq!(o.str("op").unwrap(), "all_reduce");
        assert_eq!(o.uint("bytes").unwrap(), 8);
        assert_eq!(o.num("t").unwrap(), 1.5e-3);
        assert_eq!(o.num("neg").unwrap(), -2.0);
        assert!(o.bool("ok").unwrap() && !o.bool("no").unwrap());
        assert_eq!(o.get("w"), Some(&Value::Null));
        assert_eq!(o.str("s").unwrap(), "a\"\\é😀");
        assert!(o.uint("neg").is_err() && o.uint("t").is_err() && o.str("bytes").is_err());
        assert!(o.num("missing").unwrap_err().contains("missing"));
        assert_eq!(Object::parse("{}").unwrap(), Object::default());
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "{",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{\"a\":1} x",
            "{\"a\":[1]}",
            "{\"a\":{}}",
            "{\"a\":01x}",
            "{\"a\":-}",
            "{\"a\":.5}",
            "{\"a\":1e999}",
            "{\"a\":\"x}",
            "{\"a\":\"\\q\"}",
            "{\"a\":\"\\u12\"}",
            "{\"a\":\"\\ud800\"}",
            "{\"a\":1,\"a\":2}",
            "{\"a\":tru}",
            "[1]",
        ] {
            assert!(Object::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn writes_what_it_reads() {
        let mut o = Object::default();
        o.push("op", Value::Str("x\"y\n".into()))
            .push("n", Value::Num(3.0))
            .push("t", Value::Num(0.25))
            .push("inf", Value::Num(f64::INFINITY))
            .push("b", Value::Bool(true))
            .push("z", Value::Null);
        let text = o.to_string();
        assert_eq!(text, r#"{"op":"x\"y\n","n":3,"t":0.25,"inf":null,"b":true,"z":null}"#);
        let back = Object::parse(&text).unwrap();
        assert_eq!(back.str("op").unwrap(), "x\"y\n");
        assert_eq!(back.num("t").unwrap(), 0.25);
        assert_eq!(quoted("\u{1}"), "\"\\u0001\"");
    }
}
