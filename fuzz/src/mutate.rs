//! Mutators shared by the targets: boundary numbers, and edits of text and bytes that
//! keep most of a valid input (so the mutant reaches past the parser).

use arbitrary::{Result, Unstructured};

/// A number near a boundary (0, 1, powers of two, the type's extremes) or any number.
pub fn number_u64(u: &mut Unstructured<'_>) -> Result<u64> {
    Ok(match u.int_in_range(0..=9)? {
        0 => 0,
        1 => 1,
        2 => u64::from(u.int_in_range(2..=16u8)?),
        3 => 1u64 << u.int_in_range(0..=63)?,
        4 => (1u64 << u.int_in_range(1..=63)?) - 1,
        5 => u64::MAX - u64::from(u.int_in_range(0..=2u8)?),
        6 => u64::from(u32::MAX) + u64::from(u.int_in_range(0..=2u8)?) - 1,
        7 => u64::from(u.int_in_range(0..=4096u16)?),
        _ => u.arbitrary()?,
    })
}

/// [`number_u64`] cut to 32 bits, so its boundaries are `u32`'s.
pub fn number_u32(u: &mut Unstructured<'_>) -> Result<u32> {
    let n = number_u64(u)?;
    Ok(u32::try_from(n).unwrap_or(if u.arbitrary()? { u32::MAX } else { n as u32 }))
}

/// A number up to `max` half the time, else a [`number_u32`].
pub fn small_u32(u: &mut Unstructured<'_>, max: u32) -> Result<u32> {
    if u.arbitrary()? {
        number_u32(u)
    } else {
        u.int_in_range(0..=max)
    }
}

/// `Some` of what `make` draws half the time (an optional field set or not).
pub fn maybe<T>(
    u: &mut Unstructured<'_>,
    make: impl FnOnce(&mut Unstructured<'_>) -> Result<T>,
) -> Result<Option<T>> {
    if u.arbitrary()? {
        make(u).map(Some)
    } else {
        Ok(None)
    }
}

/// A number of an `i32` enum field: each defined value, the unset 0, just past the
/// defined ones, negative, extremes.
pub fn enum_value(u: &mut Unstructured<'_>, defined: i32) -> Result<i32> {
    Ok(match u.int_in_range(0..=5)? {
        0..=2 => u.int_in_range(0..=defined)?,
        3 => defined + 1,
        4 => *u.choose(&[-1, i32::MIN, i32::MAX])?,
        _ => u.arbitrary()?,
    })
}

/// A float near a boundary (zero of both signs, tiny, huge, NaN, infinities) or any.
pub fn number_f64(u: &mut Unstructured<'_>) -> Result<f64> {
    Ok(match u.int_in_range(0..=9)? {
        0 => 0.0,
        1 => -0.0,
        2 => f64::NAN,
        3 => *u.choose(&[f64::INFINITY, f64::NEG_INFINITY])?,
        4 => *u.choose(&[f64::MIN_POSITIVE, f64::EPSILON, 5e-324, f64::MAX, f64::MIN])?,
        5 => f64::from(u.int_in_range(-4..=64i32)?),
        6 => f64::from(u.int_in_range(-1000..=1000i32)?) / 1000.0,
        7 => 10f64.powi(u.int_in_range(-320..=320)?),
        _ => f64::from_bits(u.arbitrary()?),
    })
}

/// Text for a value: a boundary number, a word from `words`, or a few odd characters.
pub fn token(u: &mut Unstructured<'_>, words: &[&str]) -> Result<String> {
    Ok(match u.int_in_range(0..=7)? {
        0 | 1 => number_u64(u)?.to_string(),
        2 => format!("-{}", number_u64(u)?),
        3 => format!("{:?}", number_f64(u)?),
        4 if !words.is_empty() => (*u.choose(words)?).to_string(),
        5 => {
            let c = *u.choose(&[
                "", " ", "\"", "'", ",", "\n", "\r", "\t", "\0", "=", "[", "]", "{", "}", "#",
                "\\", "(", ")", ";", "é", "\u{feff}", "\u{202e}", "💥",
            ])?;
            c.repeat(u.int_in_range(1..=3)?)
        }
        _ => {
            let len = u.int_in_range(0..=12)?;
            (0..len)
                .map(|_| u.arbitrary::<char>())
                .collect::<Result<String>>()?
        }
    })
}

/// Up to `max` edits of `text`: lines deleted, repeated or swapped; a number or a word
/// replaced by a [`token`]; a token inserted; the text cut; a few bytes changed.
pub fn text(u: &mut Unstructured<'_>, text: &str, words: &[&str], max: u32) -> Result<String> {
    let mut out = text.to_string();
    for _ in 0..u.int_in_range(1..=max.max(1))? {
        out = edit(u, &out, words)?;
    }
    Ok(out)
}

fn edit(u: &mut Unstructured<'_>, text: &str, words: &[&str]) -> Result<String> {
    let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
    let n = lines.len();
    let line = u.choose_index(n)?;
    Ok(match u.int_in_range(0..=9)? {
        0 => {
            lines.remove(line);
            lines.join("\n")
        }
        1 => {
            let copy = lines[line].clone();
            let to = u.choose_index(n + 1)?;
            lines.insert(to, copy);
            lines.join("\n")
        }
        2 => {
            let other = u.choose_index(n)?;
            lines.swap(line, other);
            lines.join("\n")
        }
        3 | 4 => {
            // The value after `=` or a run of digits (a number in a cell) replaced.
            let l = &lines[line];
            let value_at = l
                .find('=')
                .map(|i| i + 1)
                .or_else(|| l.find(|c: char| c.is_ascii_digit()));
            if let Some(start) = value_at {
                let end = if l[start..]
                    .trim_start()
                    .starts_with(|c: char| c.is_ascii_digit())
                {
                    let skip = l[start..].len() - l[start..].trim_start().len();
                    let from = start + skip;
                    from + l[from..]
                        .find(|c: char| !c.is_ascii_digit() && c != '.' && c != 'e' && c != '-')
                        .unwrap_or(l[from..].len())
                } else {
                    l.len()
                };
                let replacement = if l.contains('=') {
                    format!(" {}", token(u, words)?)
                } else {
                    number_u64(u)?.to_string()
                };
                lines[line] = format!("{}{}{}", &l[..start], replacement, &l[end..]);
            }
            lines.join("\n")
        }
        5 | 6 => {
            let at = char_boundary(&lines[line], u.choose_index(lines[line].len() + 1)?);
            let t = token(u, words)?;
            lines[line].insert_str(at, &t);
            lines.join("\n")
        }
        7 => {
            let at = char_boundary(text, u.choose_index(text.len() + 1)?);
            text[..at].to_string()
        }
        _ => {
            let mut b = text.as_bytes().to_vec();
            bytes(u, &mut b, 3)?;
            String::from_utf8_lossy(&b).into_owned()
        }
    })
}

/// The char boundary at or before `at` in `s`.
fn char_boundary(s: &str, at: usize) -> usize {
    (0..=at.min(s.len()))
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

/// Up to `max` byte edits: flips, boundary bytes written, bytes inserted or removed, a run
/// repeated.
pub fn bytes(u: &mut Unstructured<'_>, data: &mut Vec<u8>, max: u32) -> Result<()> {
    for _ in 0..u.int_in_range(1..=max.max(1))? {
        let at = u.choose_index(data.len() + 1)?;
        match u.int_in_range(0..=5)? {
            0 if at < data.len() => data[at] ^= 1 << u.int_in_range(0..=7)?,
            1 if at < data.len() => data[at] = *u.choose(&[0, 1, 0x7f, 0x80, 0xff])?,
            2 => data.insert(at, u.arbitrary()?),
            3 if at < data.len() => {
                data.remove(at);
            }
            4 if at < data.len() => {
                let end = (at + u.int_in_range(1..=16)?).min(data.len());
                let run = data[at..end].to_vec();
                data.splice(at..at, run);
            }
            _ => {
                let end = (at + u.int_in_range(0..=8)?).min(data.len());
                data.truncate(end.max(at));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_keep_utf8_and_change_something() {
        let base = "a = 1\nb = \"x\"\n[c]\nd = 2.5\n";
        let mut changed = 0;
        for seed in 0u8..200 {
            let data: Vec<u8> = (0..64)
                .map(|i| seed.wrapping_mul(31).wrapping_add(i))
                .collect();
            let mut u = Unstructured::new(&data);
            let out = text(&mut u, base, &["true"], 4).expect("enough input");
            changed += usize::from(out != base);
        }
        assert!(changed > 150, "{changed} of 200 changed");
    }
}
