use idem::{idempotent, Idem};

struct Svc {
    idem: Idem,
}

impl Svc {
    #[idempotent(store = self.idem, skip(self))]
    async fn charge(&self, order: u64) -> Result<u64, idem::Error> {
        Ok(order)
    }
}

fn main() {}
