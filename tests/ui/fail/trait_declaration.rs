use idem::idempotent;

pub trait Charger {
    #[idempotent]
    async fn charge(&self, order: u64) -> Result<u64, idem::Error>;
}

fn main() {}
