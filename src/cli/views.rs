//! Read-only views: `status`, `runs list`.

use super::connect::{self, Target};
use super::error::CliError;
use crate::store::{status, views};

pub async fn status(target: &Target, json: bool, last: i64) -> Result<(), CliError> {
    let client = connect::connect_target(target).await?;
    let s = status::read(&client, last).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", s.render());
    }
    Ok(())
}

pub async fn runs_list(
    target: &Target,
    trigger: Option<&str>,
    limit: i64,
    json: bool,
) -> Result<(), CliError> {
    let client = connect::connect_target(target).await?;
    let f = views::RunFilter {
        trigger,
        limit,
        ..views::RunFilter::default()
    };
    let page = views::run_page(&client, &f).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    for r in &page.runs {
        println!("{}", r.line());
    }
    Ok(())
}
