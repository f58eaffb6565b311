use idem::{idempotent, Idem};

mod app {
    #[derive(Debug)]
    pub struct Error(pub idem::Error);
    impl From<idem::Error> for Error {
        fn from(e: idem::Error) -> Self {
            Error(e)
        }
    }
    pub type Result<T> = std::result::Result<T, Error>;
}

type Res<T> = Result<T, idem::Error>;

#[idempotent(store = idem)]
async fn alias(n: u64, idem: &Idem) -> app::Result<u64> {
    Ok(n)
}

#[idempotent(store = idem)]
async fn full_path(n: u64, idem: &Idem) -> ::core::result::Result<u64, idem::Error> {
    Ok(n)
}

#[idempotent(store = idem)]
async fn question_mark(s: String, idem: &Idem) -> app::Result<u64> {
    let n: u64 = s.len().try_into().map_err(|_| app::Error(idem::Error::Config("too long".into())))?;
    if n == 0 {
        return Ok(0);
    }
    Ok(n)
}

// An alias whose name ends in `Result` is seen as one.
type MyResult<T> = Res<T>;

#[idempotent(store = idem)]
async fn mine(n: u64, idem: &Idem) -> MyResult<u64> {
    Ok(n)
}

fn main() {
    let idem = Idem::memory();
    let _ = alias(1, &idem);
    let _ = full_path(1, &idem);
    let _ = question_mark(String::new(), &idem);
    let _ = mine(1, &idem);
}
