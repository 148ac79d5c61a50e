from anatomy_cli.entry import main

main()
