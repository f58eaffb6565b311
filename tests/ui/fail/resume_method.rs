use idem::idempotent;

struct Shop;

impl Shop {
    #[idempotent(resume)]
    async fn ship(&self, order: u64) -> Result<u64, idem::Error> {
        Ok(order)
    }
}

fn main() {}
