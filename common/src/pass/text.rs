//! The text form of a pass: `{stage}{kind}{microbatch}`, parsed.

use std::str::FromStr;

use super::{Pass, PassKind};
use crate::error::Error;

/// Splits `text` as `<digits><letters><digits>`.
fn split_action(text: &str) -> Option<(u32, &str, u32)> {
    let letters_at = text.find(|c: char| !c.is_ascii_digit())?;
    let digits_at = letters_at + text[letters_at..].find(|c: char| c.is_ascii_digit())?;
    let (stage, rest) = text.split_at(letters_at);
    let (kind, mb) = rest.split_at(digits_at - letters_at);
    if stage.is_empty() || mb.is_empty() || !mb.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stage.parse().ok()?, kind, mb.parse().ok()?))
}

impl FromStr for Pass {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let bad = || Error::BadPass {
            text: text.to_string(),
            expected: "<stage><F|B|W|BW><microbatch>, e.g. 0F3 or 2BW1",
        };
        let (stage, kind, mb) = split_action(text).ok_or_else(bad)?;
        let kind = match kind {
            "F" => PassKind::F,
            "B" => PassKind::B,
            "W" => PassKind::W,
            "BW" => PassKind::BW,
            _ => return Err(bad()),
        };
        Ok(Pass { kind, stage, mb })
    }
}

impl Pass {
    /// Parses passes separated by white space (`"0F0 0F1 0B1"`), in order.
    pub fn parse_list(text: &str) -> Result<Vec<Pass>, Error> {
        text.split_whitespace().map(str::parse).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_examples() {
        assert_eq!("0F3".parse::<Pass>().ok(), Some(Pass::f(0, 3)));
        assert_eq!("5B0".parse::<Pass>().ok(), Some(Pass::b(5, 0)));
        assert_eq!("5W0".parse::<Pass>().ok(), Some(Pass::w(5, 0)));
        assert_eq!("2BW1".parse::<Pass>().ok(), Some(Pass::bw(2, 1)));
        assert_eq!(Pass::bw(12, 40).to_string(), "12BW40");
        assert_eq!(
            Pass::parse_list(" 0F3\t2BW1\n").ok(),
            Some(vec![Pass::f(0, 3), Pass::bw(2, 1)])
        );
        assert!(Pass::parse_list("0F3 0X1").is_err());
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["", "F3", "0F", "0X3", "0F3x", "-1F3", "0BWW1", "0 F 3"] {
            let err = bad.parse::<Pass>().expect_err(bad);
            assert!(err.to_string().contains("expected"), "{err}");
        }
    }

    fn any_kind() -> impl Strategy<Value = PassKind> {
        prop_oneof![
            Just(PassKind::F),
            Just(PassKind::B),
            Just(PassKind::W),
            Just(PassKind::BW)
        ]
    }

    proptest! {
        #[test]
        fn text_round_trips(kind in any_kind(), stage in 0u32..100_000, mb in 0u32..1_000_000) {
            let pass = Pass::new(kind, stage, mb);
            prop_assert_eq!(pass.to_string().parse::<Pass>().ok(), Some(pass));
        }
    }
}
