//! The elements of a `BYTES` tensor in one buffer: every element's bytes
//! back to back, and where each ends. A body of millions of short strings
//! then costs about its own size once decoded (a `Vec` per element costs 24
//! bytes and an allocation each, many times a short string's text). Pure
//! data, no I/O.

use std::fmt;
use std::ops::Range;

/// Variable-length byte strings, stored contiguously.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Strings {
    /// Every element's bytes, in order.
    bytes: Vec<u8>,
    /// `ends[i]` is where element `i` ends in `bytes` (it starts where
    /// element `i - 1` ends, or at 0).
    ends: Vec<usize>,
}

impl Strings {
    /// No elements, with room for `n` of them.
    pub fn with_capacity(n: usize) -> Strings {
        Strings {
            bytes: Vec::new(),
            ends: Vec::with_capacity(n),
        }
    }

    /// `n` empty strings.
    pub fn empties(n: usize) -> Strings {
        Strings {
            bytes: Vec::new(),
            ends: vec![0; n],
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of every element together.
    pub fn text_len(&self) -> usize {
        self.bytes.len()
    }

    /// Bytes this holds in memory.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.len() + self.ends.len() * std::mem::size_of::<usize>()
    }

    fn span(&self, i: usize) -> Range<usize> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        start..self.ends[i]
    }

    /// Element `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        (i < self.len()).then(|| &self.bytes[self.span(i)])
    }

    /// Appends one element.
    /// Room for `n` more elements' ends (their bytes grow as they come).
    pub fn reserve(&mut self, n: usize) {
        self.ends.reserve(n);
    }

    pub fn push(&mut self, s: impl AsRef<[u8]>) {
        self.bytes.extend_from_slice(s.as_ref());
        self.ends.push(self.bytes.len());
    }

    /// Appends elements `range` of `other`, in one copy of their bytes.
    pub fn extend_range(&mut self, other: &Strings, range: Range<usize>) {
        if range.is_empty() {
            return;
        }
        let from = other.span(range.start).start;
        let to = other.ends[range.end - 1];
        let base = self.bytes.len();
        self.bytes.extend_from_slice(&other.bytes[from..to]);
        self.ends
            .extend(other.ends[range].iter().map(|&e| e - from + base));
    }

    /// Appends every element of `other`.
    pub fn extend_from_slice(&mut self, other: &Strings) {
        self.extend_range(other, 0..other.len());
    }

    /// A copy of elements `range`.
    pub fn slice(&self, range: Range<usize>) -> Strings {
        let mut out = Strings::with_capacity(range.len());
        out.extend_range(self, range);
        out
    }

    /// The elements in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| &self.bytes[self.span(i)])
    }
}

impl std::ops::Index<usize> for Strings {
    type Output = [u8];

    fn index(&self, i: usize) -> &[u8] {
        &self.bytes[self.span(i)]
    }
}

impl<T: AsRef<[u8]>> FromIterator<T> for Strings {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Strings {
        let mut out = Strings::default();
        out.extend(iter);
        out
    }
}

impl<T: AsRef<[u8]>> Extend<T> for Strings {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        for s in iter {
            self.push(s.as_ref());
        }
    }
}

impl From<Vec<Vec<u8>>> for Strings {
    fn from(v: Vec<Vec<u8>>) -> Strings {
        v.into_iter().collect()
    }
}

impl fmt::Debug for Strings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|s| String::from_utf8_lossy(s)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Strings {
        v.iter().map(|s| s.as_bytes()).collect()
    }

    #[test]
    fn elements_come_back_as_pushed_empty_ones_included() {
        let s = strings(&["ab", "", "c", ""]);
        assert_eq!(s.len(), 4);
        assert_eq!(s.iter().collect::<Vec<_>>(), [&b"ab"[..], b"", b"c", b""]);
        assert_eq!(&s[2], b"c");
        assert_eq!(s.get(4), None);
        assert_eq!(s.text_len(), 3);
    }

    #[test]
    fn slices_and_extends_keep_each_element_whole() {
        let s = strings(&["ab", "", "cde", "f"]);
        assert_eq!(s.slice(1..3), strings(&["", "cde"]));
        assert_eq!(s.slice(2..2), Strings::default());
        let mut t = strings(&["x"]);
        t.extend_range(&s, 2..4);
        t.extend_from_slice(&strings(&["", "yz"]));
        assert_eq!(t, strings(&["x", "cde", "f", "", "yz"]));
    }

    #[test]
    fn many_empty_strings_cost_a_word_each() {
        let s = Strings::empties(1000);
        assert_eq!(s.len(), 1000);
        assert_eq!(s.heap_bytes(), 1000 * std::mem::size_of::<usize>());
        assert!(s.iter().all(|e| e.is_empty()));
    }
}
