//! Bad input for the Redis store, each refused clearly: a URL that does not parse, a server
//! that needs a password, a bad key prefix, a value over the size limit, a read-only replica.

mod redis_support;
use idem::store::redis::{RedisOptions, RedisStore};
use idem::{Error, Idem, Outcome};
use redis_support::{free_port, TempRedis};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

async fn a_url_that_does_not_parse_is_a_config_error() {
    for url in [
        "not a url",
        "http://127.0.0.1:6379/",
        "redis://127.0.0.1:notaport/",
        "",
    ] {
        match Idem::redis(url).await {
            Err(Error::Config(msg)) => assert!(msg.contains("Redis URL"), "{msg}"),
            other => panic!("{url:?}: expected Error::Config, got {other:?}"),
        }
    }
}

async fn a_bad_key_prefix_is_a_config_error() {
    for prefix in [
        "",
        "has space",
        "{tag}",
        "a}b",
        "tab\there",
        &"x".repeat(65),
    ] {
        // Refused before any connection is made: the URL points nowhere.
        match RedisOptions::from_url("redis://127.0.0.1:1/")
            .unwrap()
            .key_prefix(prefix)
            .connect()
            .await
        {
            Err(Error::Config(msg)) => assert!(msg.contains("key prefix"), "{msg}"),
            other => panic!("{prefix:?}: expected Error::Config, got {other:?}"),
        }
    }
}

async fn a_custom_prefix_is_used_for_every_key() {
    let server = TempRedis::start(&[]);
    let store = RedisOptions::from_url(&server.url())
        .unwrap()
        .key_prefix("app-1.idem")
        .connect()
        .await
        .unwrap();
    let digest = idem::testkit::digest("prefixed", "k");
    assert_eq!(
        store.redis_key(&digest),
        format!("app-1.idem:v1:{{{}}}", digest.to_hex())
    );
    let idem = Idem::from_store(store);
    idem.call("prefixed")
        .key("k")
        .run(async { Ok::<_, Error>(1u8) })
        .await
        .unwrap();
    let mut con = redis_support::raw(&server.url()).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(keys, vec![format!("app-1.idem:v1:{{{}}}", digest.to_hex())]);
    let name: String = redis::cmd("HGET")
        .arg(&keys[0])
        .arg("name")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(name, "prefixed");
}

async fn a_server_that_needs_a_password_is_a_clear_error_at_open() {
    let server = TempRedis::start(&["--requirepass", "s3cret"]);
    match Idem::redis(&server.url()).await {
        Err(Error::Store(e)) => {
            assert_eq!((e.backend.name(), e.op), ("redis", "open"));
            let msg = e.to_string();
            assert!(msg.contains("password"), "{msg}");
        }
        other => panic!("expected a store error at open, got {other:?}"),
    }
    let wrong = format!("redis://:wrong@127.0.0.1:{}/", server.port);
    match Idem::redis(&wrong).await {
        Err(Error::Store(e)) => assert!(e.to_string().contains("password"), "{e}"),
        other => panic!("expected a store error at open, got {other:?}"),
    }
    let right = format!("redis://:s3cret@127.0.0.1:{}/", server.port);
    let idem = Idem::redis(&right).await.unwrap();
    let out = idem
        .call("auth")
        .key("k")
        .run(async { Ok::<_, Error>(7u8) })
        .await
        .unwrap();
    assert_eq!(out, Outcome::Fresh(7));
}

async fn nothing_listening_is_a_store_error_at_open() {
    let url = format!("redis://127.0.0.1:{}/", free_port());
    match Idem::redis(&url).await {
        Err(Error::Store(e)) => assert_eq!(e.op, "open"),
        other => panic!("expected a store error, got {other:?}"),
    }
}

/// A result over the limit is refused before it is sent, and the key is released: the retry
/// runs (and succeeds with a smaller result).
async fn a_value_over_the_limit_is_refused_and_the_key_released() {
    let server = TempRedis::start(&[]);
    let store = RedisOptions::from_url(&server.url())
        .unwrap()
        .max_value_size(1024)
        .connect()
        .await
        .unwrap();
    assert_eq!(store.max_value_size(), 1024);
    let idem = Idem::from_store(store);
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |len: usize| {
        let runs = runs.clone();
        idem.call("big").key("k").run(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(vec![7u8; len])
        })
    };
    match call(4096).await {
        Err(Error::Store(e)) => {
            assert_eq!(e.op, "complete");
            let msg = e.to_string();
            assert!(msg.contains("released"), "{msg}");
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(call(10).await.unwrap(), Outcome::Fresh(vec![7u8; 10]));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The server's own `proto-max-bulk-len` caps the limit, so a value the server would refuse
/// (and close the connection over) is refused by the store first.
async fn the_servers_bulk_limit_caps_the_value_size() {
    let server = TempRedis::start(&["--proto-max-bulk-len", "1mb"]);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    assert!(store.max_value_size() < 1024 * 1024);
    let idem = Idem::from_store(store);
    let out = idem
        .call("bulk")
        .key("k")
        .run(async { Ok::<_, Error>("x".repeat(2 * 1024 * 1024)) })
        .await;
    assert!(matches!(out, Err(Error::Store(_))), "{out:?}");
    let small = idem
        .call("bulk")
        .key("k")
        .run(async { Ok::<_, Error>("x".to_string()) })
        .await
        .unwrap();
    assert_eq!(small, Outcome::Fresh("x".to_string()));
}

/// A read-only replica refuses the write scripts up front: a clear `Error::Store`, the body
/// does not run, and reads still work.
async fn a_read_only_replica_is_a_clear_store_error() {
    // A replica of a primary that is not there: read-only, serving (stale, empty) data.
    let primary = free_port().to_string();
    let replica = TempRedis::start(&["--replicaof", "127.0.0.1", &primary]);
    let idem = Idem::redis(&replica.url()).await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r2 = runs.clone();
    let out = idem
        .call("replica")
        .key("k")
        .run(async move {
            r2.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(1u8)
        })
        .await;
    match out {
        Err(Error::Store(e)) => {
            assert_eq!(e.op, "claim");
            let msg = e.to_string();
            assert!(
                msg.contains("read only replica") && msg.contains("primary"),
                "{msg}"
            );
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let digest = idem::testkit::digest("replica", "k");
    assert_eq!(idem.store().get(&digest).await.unwrap(), None);
}

/// A server over `maxmemory` with `noeviction` refuses the write scripts up front: a clear
/// `Error::Store` naming maxmemory; the body does not run.
async fn a_full_server_is_a_clear_store_error() {
    let server = TempRedis::start(&["--maxmemory", "1", "--maxmemory-policy", "noeviction"]);
    let idem = Idem::redis(&server.url()).await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r2 = runs.clone();
    let out = idem
        .call("full")
        .key("k")
        .run(async move {
            r2.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(1u8)
        })
        .await;
    match out {
        Err(Error::Store(e)) => {
            assert_eq!(e.op, "claim");
            let msg = e.to_string();
            assert!(msg.contains("maxmemory"), "{msg}");
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// An operator's release on one instance reaches another instance's local cache (pub/sub on
/// `<prefix>:v1:released`): two handles on separate connections, both caching for an hour. `a`
/// replays `k` from its cache (the stored value is changed underneath, without a message, so a
/// replay from the server would say otherwise), `b` force-releases `k`, and `a`'s next calls
/// run the body again within seconds instead of replaying the released result for an hour.
#[cfg(feature = "cache")]
async fn a_release_elsewhere_reaches_this_handles_cache() {
    let server = TempRedis::start(&[]);
    let open = || async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        Idem::from_store(store)
            .with_cache(idem::CacheOptions::new().max_age(std::time::Duration::from_secs(3600)))
    };
    let (a, b) = (open().await, open().await);
    for idem in [&a, &b] {
        assert!(
            idem.cache_follows_releases(std::time::Duration::from_secs(10))
                .await
        );
    }
    let k = idem::testkit::digest("released", "k");
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |idem: &Idem| {
        let runs = runs.clone();
        idem.call("released")
            .key("k")
            .ttl(std::time::Duration::from_secs(3600))
            .run(async move { Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) as u32 + 1) })
    };
    assert_eq!(call(&a).await.unwrap(), Outcome::Fresh(1));

    // The stored value becomes another result's (999), behind the handles' backs.
    a.call("other")
        .key("k")
        .run(async { Ok::<_, Error>(999u32) })
        .await
        .unwrap();
    let other = idem::testkit::digest("other", "k");
    let value = a.store().get(&other).await.unwrap().unwrap().value.unwrap();
    let redis_key = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .redis_key(&k);
    let mut con = redis_support::raw(&server.url()).await;
    let _: i64 = redis::cmd("HSET")
        .arg(&redis_key)
        .arg("value")
        .arg(value)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        call(&b).await.unwrap(),
        Outcome::Replayed(999),
        "b reads the server"
    );
    assert_eq!(
        call(&a).await.unwrap(),
        Outcome::Replayed(1),
        "a replays its cache"
    );

    assert!(b.force_release(&k).await.unwrap().is_some(), "b releases k");
    let released = std::time::Instant::now();
    loop {
        match call(&a).await.unwrap() {
            Outcome::Fresh(n) => {
                assert_eq!(n, 2);
                break;
            }
            Outcome::Replayed(v) => {
                assert_eq!(v, 1);
                assert!(
                    released.elapsed() < std::time::Duration::from_secs(5),
                    "a still replays from its cache 5 s after b released the key"
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
    eprintln!("a saw b's release after {:?}", released.elapsed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

idem_integration::server_tests! {
    ANYWHERE => [
        a_url_that_does_not_parse_is_a_config_error,
        a_bad_key_prefix_is_a_config_error,
        nothing_listening_is_a_store_error_at_open,
    ],
    REDIS_SERVER => [
        a_custom_prefix_is_used_for_every_key,
        a_server_that_needs_a_password_is_a_clear_error_at_open,
        a_value_over_the_limit_is_refused_and_the_key_released,
        the_servers_bulk_limit_caps_the_value_size,
        a_read_only_replica_is_a_clear_store_error,
        a_full_server_is_a_clear_store_error,
        #[cfg(feature = "cache")]
        a_release_elsewhere_reaches_this_handles_cache,
    ],
}
