//! No size cliff: a large result (4 MiB) is stored and replayed on every store; a result over
//! a function's own limit (`max_value`) is refused with a typed error and its key released.

use super::*;
use crate::CodecErrorKind;

const LARGE: usize = 4 << 20;

/// A 4 MiB result is stored and replayed whole; the body runs once.
pub async fn large_values_round_trip(idem: Idem) {
    let name = unique("large");
    let c = Counter::default();
    let call = || {
        let c = c.clone();
        idem.call(name.clone()).key("k").run(async move {
            let n = c.hit();
            // Not one repeated byte: a value that compression does not shrink to nothing.
            let text: String = (0..LARGE)
                .map(|i| char::from(b'a' + ((i * 7 + i / 251 + n) % 26) as u8))
                .collect();
            Ok::<_, Failure>(text)
        })
    };
    let fresh = call().await.unwrap();
    assert!(!fresh.is_replayed());
    let fresh = fresh.into_inner();
    assert_eq!(fresh.len(), LARGE);
    let again = call().await.unwrap();
    assert!(again.is_replayed(), "the large result is replayed");
    assert!(again.into_inner() == fresh, "replayed whole");
    assert_eq!(c.get(), 1);
}

/// Over a function's own limit: `TooLarge` naming the limit and the size, nothing stored, the
/// key released so that the next call runs.
pub async fn over_the_limit_is_refused_and_released(idem: Idem) {
    let name = unique("overlimit");
    let limit = 64 << 10;
    let big = idem
        .call(name.clone())
        .key("k")
        .max_value(limit)
        // Bytes that compression cannot shrink under the limit (the sealed variant compresses).
        .run(async move { Ok::<_, Failure>(incompressible(2 * limit)) })
        .await;
    match big {
        Err(Failure::Idem(Error::Codec(e))) => {
            assert_eq!(e.kind, CodecErrorKind::TooLarge, "{e}");
            let text = e.to_string();
            assert!(text.contains(&limit.to_string()), "names the limit: {text}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(
        idem.store().get(&digest(&name, "k")).await.unwrap(),
        None,
        "nothing stored, the key released"
    );
    let small = idem
        .call(name.clone())
        .key("k")
        .max_value(limit)
        .run(async { Ok::<_, Failure>(vec![1u8; 16]) })
        .await
        .unwrap();
    assert!(!small.is_replayed(), "the next call runs");
}

/// `len` bytes from a xorshift generator: no run or repeat a compressor could fold.
fn incompressible(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
