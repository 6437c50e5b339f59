from msgbusd.site.cli import main

main()
